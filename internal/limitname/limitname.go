// Package limitname holds the rules of limit and plan names and quotas
// that the root package and the operator package share.
package limitname

const (
	// MaxLen is the longest limit or plan name, in bytes.
	MaxLen = 64
	// MaxQuota is the largest quota of a limit, a plan or an override.
	MaxQuota = 1_000_000
)

// Valid reports whether name is a non-empty run of at most MaxLen ASCII
// letters, digits and "-_.", which is safe in a Redis key, a
// hash-tag-free prefix and an IETF sf-string without escaping.
func Valid(name string) bool {
	if name == "" || len(name) > MaxLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
