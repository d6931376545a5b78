package bytesize

import (
	"testing"

	"go.yaml.in/yaml/v3"
	"pgregory.net/rapid"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]Size{"4194304": 4 << 20, "4MiB": 4 << 20, " 2 KiB ": 2048, "1GB": 1e9, "7B": 7, "3KB": 3000, "1GiB": GiB} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "4 TiB", "1.5MiB", "99999999999999999999", "4611686018427387904KiB"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}

// String reads back as the same size, through YAML.
func TestStringRoundTrips(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := Size(rapid.Int64Range(0, 1<<50).Draw(t, "b"))
		var got Size
		if err := yaml.Unmarshal([]byte(`"`+b.String()+`"`), &got); err != nil || got != b {
			t.Fatalf("%d -> %q -> %d, %v", b, b.String(), got, err)
		}
	})
}

func TestUnmarshalYAML(t *testing.T) {
	var b Size
	if err := yaml.Unmarshal([]byte("1048576"), &b); err != nil || b != MiB {
		t.Fatalf("integer: %v, %v", b, err)
	}
	if err := yaml.Unmarshal([]byte("[1]"), &b); err == nil {
		t.Fatal("a list was accepted")
	}
	if err := yaml.Unmarshal([]byte("true"), &b); err == nil {
		t.Fatal("a bool was accepted")
	}
}

func FuzzParse(f *testing.F) {
	f.Add("4MiB")
	f.Add("-3KB")
	f.Fuzz(func(t *testing.T, s string) {
		if b, err := Parse(s); err == nil {
			if again, err := Parse(b.String()); err != nil || again != b {
				t.Fatalf("Parse(%q) = %d, whose String %q reads back as %d, %v", s, b, b.String(), again, err)
			}
		}
	})
}
