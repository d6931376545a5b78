package procs

import (
	"fmt"
	"os"
	"syscall"
)

// execSelf replaces the process's program with its own executable
// (/proc/self/exe where the system has it: the file this process runs,
// even if its path was replaced since).
func execSelf(args, env []string) error {
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("%w: %w", ErrNoExec, err)
		}
	}
	err := syscall.Exec(exe, args, env)
	return fmt.Errorf("%w: exec %s: %w", ErrNoExec, exe, err)
}
