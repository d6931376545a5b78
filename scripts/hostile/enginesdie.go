package main

import (
	"fmt"
	"strings"
	"syscall"
	"time"
)

func runEnginesDie(h *harness) (result, error) {
	st, err := h.startStack("engines-die", stackOpts{})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	urls := []string{st.base + probePath(st.base)}
	if p := probePath(st.admin); p == "/readyz" {
		urls = append(urls, st.admin+p)
	}
	if !strings.HasSuffix(urls[0], "/health") {
		urls = append(urls, st.base+"/health")
	}
	probeAll := func() []string {
		var out []string
		for _, u := range urls {
			code, _, err := getStatus(u, time.Second)
			out = append(out, statusOrErr(code, err))
		}
		return out
	}
	before := probeAll()
	for _, e := range st.engines {
		e.signal(syscall.SIGKILL)
	}
	t0 := time.Now()
	var timeline []string
	var at3 []string
	for _, at := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		time.Sleep(time.Until(t0.Add(at)))
		got := probeAll()
		timeline = append(timeline, fmt.Sprintf("%s: %s", at, strings.Join(got, " / ")))
		at3 = got
	}
	ok := true
	var cells []string
	for i, u := range urls {
		name := strings.TrimPrefix(strings.TrimPrefix(u, st.base), st.admin)
		where := "client"
		if strings.HasPrefix(u, st.admin) {
			where = "admin"
		}
		cells = append(cells, fmt.Sprintf("%s %s %s", where, name, at3[i]))
		if at3[i] != "503" {
			ok = false
		}
	}
	fig := "3 s after SIGKILL of all 3 engines: " + strings.Join(cells, ", ")
	d := []string{
		fmt.Sprintf("Probed (fresh connection each): %s. Before the kill: %s.", strings.Join(urls, ", "), strings.Join(before, " / ")),
		"After SIGKILL of every engine: " + strings.Join(timeline, "; ") + ".",
		"The admin port has no readiness endpoint unless /readyz answers there; it is probed only then.",
	}
	return result{Figures: fig, Met: metWord(ok), Details: d}, nil
}
