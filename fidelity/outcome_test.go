package fidelity

import (
	"testing"

	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/traces"
)

// The trace replay and the recorder name a rate-limited request alike.
func TestRateLimitedOutcomeIsOneName(t *testing.T) {
	if traces.OutcomeRateLimited != results.RejectRateLimited {
		t.Fatalf("traces.OutcomeRateLimited %q, results.RejectRateLimited %q", traces.OutcomeRateLimited, results.RejectRateLimited)
	}
}
