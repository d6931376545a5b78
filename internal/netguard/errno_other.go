//go:build !unix

package netguard

// temporaryErrnos is empty off Unix: only errors that say they are
// temporary are waited out.
var temporaryErrnos []error
