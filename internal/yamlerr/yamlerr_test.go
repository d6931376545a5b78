package yamlerr

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type inner struct {
	Size  int           `yaml:"size"`
	Wait  time.Duration `yaml:"wait"`
	Ratio float64       `yaml:"ratio"`
	On    bool          `yaml:"on"`
	Name  string        `yaml:"name"`
}

type outer struct {
	Name  string  `yaml:"name"`
	Inner inner   `yaml:"inner"`
	Items []inner `yaml:"items"`
	Skip  int     `yaml:"-"`
}

func decode(doc string) error {
	var o outer
	dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
	dec.KnownFields(true)
	return Explain(dec.Decode(&o), reflect.TypeFor[outer]())
}

func TestExplain(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"nope: 1\n", "line 1: nope: unknown field; known fields here: inner, items, name"},
		{"inner:\n  nope: 1\n", "line 2: nope: unknown field; known fields here: name, on, ratio, size, wait"},
		{"inner: 3\n", `line 1: want a mapping with the fields name, on, ratio, size, wait, got the number "3"`},
		{"items: 3\n", `line 1: want a list of mappings with the fields name, on, ratio, size, wait, got the number "3"`},
		{"inner:\n  size: big\n", `line 2: want a whole number, got the text "big"`},
		{"inner:\n  ratio: half\n", `line 2: want a number, got the text "half"`},
		{"inner:\n  wait: soon\n", `line 2: want a duration such as "10m" or "500ms", got the text "soon"`},
		{"inner:\n  on: [1]\n", "line 2: want true or false, got a list"},
		{"name: {a: 1}\n", "line 1: want text, got a mapping"},
		{"nope: 1\nname: [1]\n", "line 1: nope: unknown field; known fields here: inner, items, name; line 2: want text, got a list"},
	} {
		err := decode(c.doc)
		if err == nil || err.Error() != c.want {
			t.Errorf("%q:\n got %v\nwant %s", c.doc, err, c.want)
		}
	}
}

// Errors that are not type errors pass through unchanged.
func TestExplainPassesOtherErrors(t *testing.T) {
	if err := decode("name: [\n"); err == nil || !strings.Contains(err.Error(), "yaml:") {
		t.Errorf("syntax error: %v", err)
	}
	other := errors.New("other")
	if got := Explain(other, reflect.TypeFor[outer]()); got != other {
		t.Errorf("got %v", got)
	}
	if Explain(nil, reflect.TypeFor[outer]()) != nil {
		t.Error("nil error not kept")
	}
}
