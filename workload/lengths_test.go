package workload

import "testing"

// TestMeanLengths: the means cover a closed loop's later, longer turns, do
// not depend on the run's length or rate, and are reproducible.
func TestMeanLengths(t *testing.T) {
	c, err := DefaultConfig("w2")
	if err != nil {
		t.Fatal(err)
	}
	l, err := MeanLengths(c, 400)
	if err != nil {
		t.Fatal(err)
	}
	if l.Requests != 400 || !(l.Prompt > 0) || !(l.Output > 0) {
		t.Fatalf("lengths %+v", l)
	}
	// First turns alone are shorter: every later turn resends the chat.
	src, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	var first float64
	n := 0
	for ; n < 100; n++ {
		r, ok := src.Next()
		if !ok {
			break
		}
		first += float64(r.PromptTokens())
	}
	if first /= float64(n); !(l.Prompt > 1.2*first) {
		t.Errorf("mean prompt %.0f tokens, first turns alone %.0f: the later turns are missing", l.Prompt, first)
	}
	c.Requests, c.Rate = 10, 50
	again, err := MeanLengths(c, 400)
	if err != nil || again != l {
		t.Errorf("with another run length and rate: %+v (%v), want %+v", again, err, l)
	}
	if _, err := MeanLengths(c, 0); err == nil {
		t.Error("no error for zero requests")
	}
}
