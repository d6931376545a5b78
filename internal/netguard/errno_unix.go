//go:build unix

package netguard

import "syscall"

// temporaryErrnos are the accept errors Accept waits out: no descriptor,
// buffer or memory to spare, an interrupted call, and the errors of a
// connection that failed before it was accepted (accept(2) passes them on
// and advises to retry).
var temporaryErrnos = []error{
	syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
	syscall.EINTR, syscall.EAGAIN,
	syscall.ECONNABORTED, syscall.ECONNRESET, syscall.ETIMEDOUT, syscall.EPROTO, syscall.EPERM,
	syscall.ENETDOWN, syscall.ENETUNREACH, syscall.EHOSTDOWN, syscall.EHOSTUNREACH,
	syscall.ENOPROTOOPT, syscall.EOPNOTSUPP,
}
