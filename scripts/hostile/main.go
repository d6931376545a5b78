// Command hostile reruns the hostile-client scenarios against inferrail live
// and prints their figures: for each scenario it starts three mock engines
// (inferrail engine) and the proxy with a generated configuration, attacks
// it, stops everything it started, and reports one row of a markdown table
// (also written to runs/hostile/results.md) saying whether the scenario's
// goal was met. A missed goal is a result, not a failure: the command exits
// 0 unless the harness itself cannot run (no binary, a stack that does not
// start).
//
// Usage, from the repository root (make hostile builds and runs it):
//
//	go run ./scripts/hostile [--bin bin/inferrail] [--scenario big-body] [--out runs/hostile]
//
// Reading guide: scenarios.go lists the scenarios and the table; stack.go
// starts and stops the engines and the proxy; procs.go owns every child
// process (all are killed on return, on a failure and on Ctrl-C); one file
// per scenario holds its attack (h2raw.go is the HTTP/2 client that never
// reads, stall.go the connections that never finish their bodies).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hostile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin/inferrail", "the inferrail binary (make build)")
	only := fs.String("scenario", "", "run one scenario: "+strings.Join(scenarioNames(), ", "))
	out := fs.String("out", "runs/hostile", "directory of results.md")
	nodeModules := fs.String("node-modules", ".cache/node/node_modules", "where make node-deps installed the OpenAI Node SDK")
	worker := fs.String("stall-worker", "", "internal: hold stalled connections to this address")
	workerN := fs.Int("stall-n", 0, "internal: how many connections the stall worker opens")
	workerAddrs := fs.Int("stall-addrs", 1, "internal: how many source addresses the stall worker spreads them over (127.0.0.2 on)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *worker != "" {
		return runStallWorker(*worker, *workerN, *workerAddrs, stdout)
	}
	var todo []scenario
	for _, s := range scenarios() {
		if *only == "" || s.name == *only {
			todo = append(todo, s)
		}
	}
	if len(todo) == 0 {
		fmt.Fprintf(stderr, "hostile: unknown scenario %q; one of %s\n", *only, strings.Join(scenarioNames(), ", "))
		return 2
	}

	// Every child dies with the harness: on Ctrl-C, on SIGTERM and on
	// return (Pdeathsig covers a crash).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(stderr, "hostile: %v: stopping everything started\n", s)
		stopAll()
		removeTmp()
		os.Exit(130)
	}()
	defer stopAll()

	h, err := newHarness(*bin, *nodeModules)
	if err != nil {
		fmt.Fprintf(stderr, "hostile: %v\n", err)
		return 1
	}
	defer removeTmp()

	var results []result
	for _, s := range todo {
		fmt.Fprintf(stderr, "hostile: %s ...\n", s.name)
		began := time.Now()
		r, err := s.run(h)
		stopAll() // whatever the scenario left running
		if err != nil {
			if errors.Is(err, errStack) {
				fmt.Fprintf(stderr, "hostile: %s: %v\n", s.name, err)
				return 1
			}
			r = result{Figures: "harness error: " + err.Error(), Met: "n/a"}
		}
		r.name, r.goal, r.took = s.name, s.goal, time.Since(began)
		fmt.Fprintf(stderr, "hostile: %s: %s (%.1f s)\n", s.name, r.Met, r.took.Seconds())
		results = append(results, r)
	}
	command := os.Getenv("HOSTILE_COMMAND") // scripts/hostile.sh names itself
	if command == "" {
		command = strings.TrimSpace("go run ./scripts/hostile " + strings.Join(args, " "))
	}
	report := renderReport(h, results, command)
	fmt.Fprint(stdout, report)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(stderr, "hostile: %v\n", err)
		return 1
	}
	path := filepath.Join(*out, "results.md")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		fmt.Fprintf(stderr, "hostile: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "hostile: wrote %s\n", path)
	return 0
}
