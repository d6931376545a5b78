package main

import (
	"path/filepath"
	"testing"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/workload"
)

// TestExamplesStayValid keeps the files the README points at loadable, and
// the spelled-out default profile equal to the built-in one.
func TestExamplesStayValid(t *testing.T) {
	c, err := engine.LoadConfig(filepath.Join("..", "..", "examples", "profile-default-8b-24gb.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c != engine.DefaultConfig() {
		t.Fatalf("examples/profile-default-8b-24gb.yaml differs from the built-in profile:\n%+v\n%+v", c, engine.DefaultConfig())
	}
	if _, err := workload.LoadConfig(filepath.Join("..", "..", "examples", "w1-hot-prompts.yaml")); err != nil {
		t.Fatal(err)
	}
}
