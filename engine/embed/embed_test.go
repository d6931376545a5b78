package embed

import (
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"pgregory.net/rapid"
	"testing"
)

// Threshold is the similarity the fixed test sets are checked against:
// semcache's default threshold (0.95). Paraphrases must reach it and
// unrelated texts must stay below Unrelated, a margin under it.
const (
	Threshold = 0.95
	Unrelated = 0.90
)

// Paraphrases are pairs that ask the same thing in other words' order,
// case, punctuation, inflection, function words or with a small typo: what
// this method can see. Synonyms are not here (it cannot).
var Paraphrases = [][2]string{
	{"How do I reset my password?", "how can i reset my password"},
	{"What is the capital of France?", "capital of france?"},
	{"What's the capital of France", "Tell me the capital of France, please."},
	{"Explain how photosynthesis works.", "How does photosynthesis work?"},
	{"Translate 'good morning' into Spanish", "translate good morning into spanish"},
	{"What are the symptoms of diabetes?", "What is a symptom of diabetes"},
	{"Write a haiku about the ocean", "write an ocean haiku"},
	{"List the planets of the solar system", "list the solar system's planets"},
	{"How many legs does a spider have?", "How many legs do spiders have"},
	{"Convert 100 Fahrenheit to Celsius", "convert 100 fahrenheit to celsius."},
	{"Who wrote Pride and Prejudice?", "Pride and Prejudice: who wrote it?"},
	{"Best way to learn Go programming", "the best way to learn programming in Go"},
	{"résumé tips for engineers", "Resume tips for engineers"},
	{"How do I install PostgreSQL on Debian?", "Installing PostgreSQL on Debian: how?"},
	{"Summarize the plot of Hamlet", "Hamlet's plot, summarized"},
	{"Why is the sky blue?", "why is the sky blue"},
	{"Can you explain recursion with an example?", "Recursion: an example, please"},
}

// UnrelatedPairs are pairs that must not share an answer, including the
// near misses a semantic cache gets wrong: another entity, another number,
// a negation, the same words about something else.
var UnrelatedPairs = [][2]string{
	{"How do I reset my password?", "What is the capital of France?"},
	{"What is the capital of France?", "What is the capital of Spain?"},
	{"What is 17 times 23?", "What is 17 times 24?"},
	{"Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?"},
	{"Write a haiku about the ocean", "Write a limerick about the ocean"},
	{"Translate 'good morning' into Spanish", "Translate 'good morning' into German"},
	{"How many legs does a spider have?", "How many eyes does a spider have?"},
	{"Explain how photosynthesis works.", "Explain how vaccines work."},
	{"Convert 100 Fahrenheit to Celsius", "Convert 100 Celsius to Kelvin"},
	{"Who wrote Pride and Prejudice?", "Who wrote War and Peace?"},
	{"Best way to learn Go programming", "Best way to learn Rust programming"},
	{"hello", "goodbye"},
	{"Give me a recipe for pancakes", "How do I change a car tire?"},
	{"Summarize the plot of Hamlet", "Summarize the plot of Macbeth"},
	{"List the planets of the solar system", "List the moons of Jupiter"},
}

func vec(t testing.TB, s string) []float32 {
	t.Helper()
	v, err := Vector(s, DefaultDim)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestParaphrasesAreClose(t *testing.T) {
	for _, p := range Paraphrases {
		if s := Cosine(vec(t, p[0]), vec(t, p[1])); s < Threshold {
			t.Errorf("%q ~ %q: similarity %.4f, want >= %v", p[0], p[1], s, Threshold)
		} else {
			t.Logf("%.4f  %q ~ %q", s, p[0], p[1])
		}
	}
}

func TestUnrelatedAreFar(t *testing.T) {
	for _, p := range UnrelatedPairs {
		if s := Cosine(vec(t, p[0]), vec(t, p[1])); s >= Unrelated {
			t.Errorf("%q vs %q: similarity %.4f, want < %v", p[0], p[1], s, Unrelated)
		} else {
			t.Logf("%.4f  %q vs %q", s, p[0], p[1])
		}
	}
}

func norm2(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return s
}

func TestSameTextSameVector(t *testing.T) {
	a := vec(t, "How do I reset my password?")
	b := vec(t, "How do I reset my password?")
	if !slices.Equal(a, b) {
		t.Fatal("two embeddings of one text differ")
	}
	if n := norm2(a); math.Abs(n-1) > 1e-6 {
		t.Fatalf("squared norm %v, want 1", n)
	}
}

// TestGolden pins the method: the same text must give the same vector on
// every machine and in every later version, or cached entries made by an
// older engine silently stop matching. A deliberate change of the method
// updates these numbers.
func TestGolden(t *testing.T) {
	v := vec(t, "How do I reset my password?")
	var nonZero int
	var sum float64
	for i, x := range v {
		if x != 0 {
			nonZero++
			sum += float64(x) * float64(i+1)
		}
	}
	if nonZero != 15 || math.Abs(sum-goldenSum) > 1e-4 {
		t.Fatalf("embedding changed: %d non-zero dimensions, weighted sum %.6f; want 15 and %.6f", nonZero, sum, goldenSum)
	}
}

const goldenSum = 69.434551

func TestDimensions(t *testing.T) {
	for _, d := range []int{1, 2, 64, DefaultDim, MaxDim} {
		v, err := Vector("the quick brown fox", d)
		if err != nil {
			t.Fatal(err)
		}
		if len(v) != d {
			t.Fatalf("dim %d: got %d values", d, len(v))
		}
		if n := norm2(v); math.Abs(n-1) > 1e-5 {
			t.Fatalf("dim %d: squared norm %v, want 1", d, n)
		}
	}
	for _, d := range []int{0, -1, MaxDim + 1} {
		if _, err := Vector("x", d); err == nil {
			t.Fatalf("dim %d: no error", d)
		}
	}
}

func TestBlankIsZero(t *testing.T) {
	for _, s := range []string{"", "   ", "\t\n"} {
		if n := norm2(vec(t, s)); n != 0 {
			t.Fatalf("%q: squared norm %v, want 0", s, n)
		}
	}
	// Symbols alone still embed, and differently from each other.
	a, b := vec(t, "???"), vec(t, "!!!")
	if norm2(a) == 0 || Cosine(a, b) > 0.5 {
		t.Fatalf("symbols: norm %v, similarity %v", norm2(a), Cosine(a, b))
	}
}

func TestStem(t *testing.T) {
	for in, want := range map[string]string{
		"passwords": "password", "resetting": "reset", "reset": "reset", "spiders": "spider",
		"symptoms": "symptom", "planets": "planet", "boxes": "box", "churches": "church",
		"stories": "story", "summarized": "summariz", "summarize": "summariz", "falling": "fall",
		"glass": "glass", "virus": "virus", "analysis": "analysis", "quickly": "quick", "go": "go",
	} {
		if got := stem(in); got != want {
			t.Errorf("stem(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestInvariances: case, punctuation, spacing, word order and function
// words do not move a text of content words.
func TestInvariances(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		word := rapid.StringMatching(`[a-z]{4,9}`).Filter(func(w string) bool { return !isStop(w) })
		words := rapid.SliceOfN(word, 1, 12).Draw(t, "words")
		seps := []string{" ", ", ", "  ", "? ", "; ", " - "}
		var a, b []string
		a = append(a, words...)
		perm := rapid.Permutation(words).Draw(t, "perm")
		for i, w := range perm {
			if rapid.Bool().Draw(t, "upper") {
				w = strings.ToUpper(w)
			}
			if rapid.Bool().Draw(t, "stop") {
				b = append(b, "the ")
			}
			b = append(b, w)
			if i < len(perm)-1 {
				b = append(b, rapid.SampledFrom(seps).Draw(t, "sep"))
			}
		}
		va, _ := Vector(strings.Join(a, " "), DefaultDim)
		vb, _ := Vector(strings.Join(b, ""), DefaultDim)
		if s := Cosine(va, vb); s < 0.99999 {
			t.Fatalf("%q vs %q: similarity %v, want 1", strings.Join(a, " "), strings.Join(b, ""), s)
		}
	})
}

func FuzzVector(f *testing.F) {
	for _, p := range Paraphrases {
		f.Add(p[0])
	}
	f.Add("")
	f.Add("\xff\xfe não é")
	f.Add("don't   ’s  ...")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := Vector(s, 64)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Vector(s, 64)
		if !slices.Equal(a, b) {
			t.Fatal("not deterministic")
		}
		n := norm2(a)
		if math.IsNaN(n) || (n != 0 && math.Abs(n-1) > 1e-5) {
			t.Fatalf("squared norm %v, want 0 or 1", n)
		}
		if n == 0 && strings.TrimFunc(s, unicode.IsSpace) != "" && utf8.ValidString(s) {
			t.Fatalf("%q: zero vector for a text with visible characters", s)
		}
	})
}

func BenchmarkVector(b *testing.B) {
	for _, c := range []struct {
		name string
		text string
	}{
		{"question", "How do I reset my password on the admin console without losing my saved settings?"},
		{"1kB", strings.Repeat("The quick brown fox jumps over the lazy dog near the river bank. ", 16)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.text)))
			for b.Loop() {
				if _, err := Vector(c.text, DefaultDim); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
