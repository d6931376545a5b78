package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

// registerCompletions gives every command's name-taking flags shell
// completion of the names they take: policies, workloads, profile presets
// (and files), admission rules, trace formats. Comma-separated lists
// complete their last element.
func registerCompletions(root *cobra.Command) {
	one := func(names func() []string, files bool) cobra.CompletionFunc {
		return func(_ *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			d := cobra.ShellCompDirectiveNoFileComp
			if files {
				d = cobra.ShellCompDirectiveDefault
			}
			return names(), d
		}
	}
	list := func(names func() []string) cobra.CompletionFunc {
		return func(_ *cobra.Command, _ []string, typed string) ([]cobra.Completion, cobra.ShellCompDirective) {
			head := ""
			if i := strings.LastIndexByte(typed, ','); i >= 0 {
				head = typed[:i+1]
			}
			var out []cobra.Completion
			for _, n := range append(names(), "all") {
				out = append(out, head+n)
			}
			return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
		}
	}
	byFlag := map[string]cobra.CompletionFunc{
		"policy":       one(router.Names, false),
		"policies":     list(router.Names),
		"workload":     one(workload.Names, false),
		"profile":      one(calibrate.PresetNames, true),
		"preset":       one(calibrate.PresetNames, false),
		"admission":    one(gateway.Admissions, false),
		"admissions":   list(gateway.Admissions),
		"trace-format": one(traces.Formats, false),
		"format":       one(traces.Formats, false),
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for name, fn := range byFlag {
			if c.LocalFlags().Lookup(name) != nil {
				_ = c.RegisterFlagCompletionFunc(name, fn) // fails only when already registered
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
