package apitype

// Scopes a bearer token can carry. admin implies exec, exec implies read.
const (
	ScopeRead  = "read"
	ScopeExec  = "exec"
	ScopeAdmin = "admin"
)

// ScopeIncludes reports whether one of the scopes have grants need
// (admin implies exec, exec implies read; an unknown scope grants nothing).
func ScopeIncludes(have []string, need string) bool {
	rank := map[string]int{ScopeRead: 1, ScopeExec: 2, ScopeAdmin: 3}
	for _, h := range have {
		if rank[h] >= rank[need] {
			return true
		}
	}
	return false
}
