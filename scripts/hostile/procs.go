package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is one child process the harness started. Each runs in its own
// process group, so stopping it also stops whatever it started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // its stderr (and stdout unless redirected)
	done chan struct{}
}

// registry holds every child still to be stopped.
var registry struct {
	sync.Mutex
	procs []*proc
}

// spawn starts bin with args; stderr goes to logPath, stdout there too
// unless stdout is set. stdin may be nil.
func spawn(name, logPath string, stdin *os.File, stdout *os.File, env []string, bin string, args ...string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = f
	cmd.Stdout = f
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if stdin != nil {
		cmd.Stdin = stdin
	}
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	registry.Lock()
	registry.procs = append(registry.procs, p)
	registry.Unlock()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the process itself (not its group).
func (p *proc) signal(sig syscall.Signal) {
	if p.alive() {
		syscall.Kill(p.pid(), sig)
	}
}

// stop ends p's process group: SIGCONT (it may be stopped), SIGTERM, and
// SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if !p.alive() {
		return
	}
	pg := -p.pid()
	syscall.Kill(pg, syscall.SIGCONT)
	syscall.Kill(pg, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(pg, syscall.SIGKILL)
		<-p.done
	}
}

// stopAll stops every child started so far, all at once.
func stopAll() {
	registry.Lock()
	ps := registry.procs
	registry.procs = nil
	registry.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() { p.stop(time.Second) })
	}
	wg.Wait()
}

// memStat is a process's resident memory, in bytes.
type memStat struct {
	rss, hwm int64
}

// readMem reads VmRSS and VmHWM from /proc/PID/status.
func readMem(pid int) (memStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memStat{}, err
	}
	var m memStat
	for _, line := range splitLines(b) {
		var kb int64
		if n, _ := fmt.Sscanf(line, "VmRSS: %d kB", &kb); n == 1 {
			m.rss = kb << 10
		}
		if n, _ := fmt.Sscanf(line, "VmHWM: %d kB", &kb); n == 1 {
			m.hwm = kb << 10
		}
	}
	return m, nil
}

// fdCount is the number of open descriptors of pid (/proc/PID/fd).
func fdCount(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(4096)
		n += len(names)
		if err == io.EOF || len(names) == 0 {
			return n
		}
		if err != nil {
			return n
		}
	}
}

// fdLimit is pid's soft RLIMIT_NOFILE (/proc/PID/limits), or -1.
func fdLimit(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return -1
	}
	for _, line := range splitLines(b) {
		var soft int
		if n, _ := fmt.Sscanf(line, "Max open files %d", &soft); n == 1 {
			return soft
		}
	}
	return -1
}

func splitLines(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == '\n' {
			out = append(out, string(b[start:i]))
			start = i + 1
		}
	}
	if start < len(b) {
		out = append(out, string(b[start:]))
	}
	return out
}

const mib = 1 << 20

func fmtMiB(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/mib) }
