package pveapi

// Classify is classify, for the external tests.
var Classify = classify
