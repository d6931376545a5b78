//go:build unix

package netguard

import (
	"syscall"
	"testing"
)

func TestDefaultMaxConns(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Skip(err)
	}
	got, err := DefaultMaxConns()
	if want := int(rl.Cur/2) - fdReserve; err != nil || got != want {
		t.Errorf("DefaultMaxConns() = %d, %v; want %d (limit %d)", got, err, want, rl.Cur)
	}
}
