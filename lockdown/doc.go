// Package lockdown runs the marker-gated egress lockdown of DESIGN.md section
// 4: event driven, fail closed, and fail deadly (halt) when the lockdown is
// asked for but cannot be proven in force.
package lockdown
