package synth

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/traces"
)

func read(t *testing.T, b []byte) []traces.Record {
	t.Helper()
	r := traces.NewMooncake(bytes.NewReader(b), "synth", traces.Options{})
	var out []traces.Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rec)
	}
}

// The default trace is of the kind it claims: long prompts, most of each
// shared with an earlier one, read back by the Mooncake reader.
func TestDefaultIsMooncakeKind(t *testing.T) {
	var b bytes.Buffer
	if err := Generate(&b, Default()); err != nil {
		t.Fatal(err)
	}
	recs := read(t, b.Bytes())
	if len(recs) != Default().Requests {
		t.Fatalf("%d records, want %d", len(recs), Default().Requests)
	}
	var in []int
	seen := map[uint64]bool{}
	reused, total := 0, 0
	for _, r := range recs {
		in = append(in, r.InputTokens)
		prefix := true
		for k, id := range r.HashIDs {
			n := min(512, r.InputTokens-k*512)
			total += n
			if prefix && seen[id] {
				reused += n
			} else {
				prefix = false
			}
			seen[id] = true
		}
	}
	slices.Sort(in)
	p50, p99 := in[len(in)/2], in[len(in)*99/100]
	share := float64(reused) / float64(total)
	t.Logf("input p50 %d p99 %d, prefix reuse (unlimited cache) %.1f%%", p50, p99, 100*share)
	if p50 < 8000 || p50 > 16000 || p99 < 45000 || p99 > 100000 || share < 0.5 {
		t.Errorf("input p50 %d, p99 %d, reuse %.2f: want a Mooncake-kind trace (p50 ~11k, p99 ~66k, reuse > 50%%)", p50, p99, share)
	}
	var again bytes.Buffer
	Generate(&again, Default())
	if !bytes.Equal(b.Bytes(), again.Bytes()) {
		t.Error("the same config gave different bytes")
	}
}

func TestValidateNamesParameters(t *testing.T) {
	for _, c := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.InputMax = 1000 }, "input-max 1000: must be at least prefix-tokens + input-median"},
		{func(c *Config) { c.OutputMax = 10 }, "output-max"},
		{func(c *Config) { c.Rate = 0 }, "rate"},
		{func(c *Config) { c.NewSession = 1.5 }, "new-session"},
		{func(c *Config) { c.PrefixZipf = 1 }, "prefix-zipf"},
		{func(c *Config) { c.ArrivalCV = 0 }, "arrival-cv"},
		{func(c *Config) { c.TurnSigma = -1 }, "turn-sigma"},
	} {
		cfg := Default()
		c.edit(&cfg)
		err := Generate(io.Discard, cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error naming %q, got %v", c.want, err)
		}
	}
}
