package workload

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yamlTypeErrors rewrites a strict decoder's type errors for the user: an
// unknown key lists the keys allowed where it stands, and a value of the
// wrong kind says which kind is wanted, instead of naming Go types. Other
// errors pass through.
func yamlTypeErrors(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	types := configTypes()
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = rewriteTypeError(m, types)
	}
	return errors.New(strings.Join(msgs, "; "))
}

var (
	unknownField = regexp.MustCompile(`^(line \d+): field (\S+) not found in type workload\.(\w+)$`)
	wrongKind    = regexp.MustCompile("^(line \\d+): cannot unmarshal !!(\\w+) `(.*)` into (\\S+)$")
)

func rewriteTypeError(m string, types map[string]reflect.Type) string {
	if g := unknownField.FindStringSubmatch(m); g != nil {
		if t, ok := types[g[3]]; ok {
			return fmt.Sprintf("%s: %s: unknown field; known fields here: %s", g[1], g[2], strings.Join(yamlFields(t), ", "))
		}
		return fmt.Sprintf("%s: %s: unknown field", g[1], g[2])
	}
	if g := wrongKind.FindStringSubmatch(m); g != nil {
		want := g[4]
		name := strings.TrimPrefix(strings.TrimPrefix(want, "[]"), "workload.")
		switch t, ok := types[name]; {
		case ok && strings.HasPrefix(want, "[]"):
			want = "a list of mappings with the fields " + strings.Join(yamlFields(t), ", ")
		case ok:
			want = "a mapping with the fields " + strings.Join(yamlFields(t), ", ")
		case strings.HasPrefix(want, "time.Duration"):
			want = `a duration such as "10m" or "500ms"`
		case strings.HasPrefix(want, "float"):
			want = "a number"
		case strings.HasPrefix(want, "int") || strings.HasPrefix(want, "uint"):
			want = "a whole number"
		case strings.HasPrefix(want, "[]"):
			want = "a list"
		}
		return fmt.Sprintf("%s: want %s, got %s %q", g[1], want, kindWord(g[2]), g[3])
	}
	return m
}

// kindWord names a YAML tag's kind.
func kindWord(tag string) string {
	switch tag {
	case "int", "float":
		return "the number"
	case "bool":
		return "the boolean"
	case "seq":
		return "a list"
	case "map":
		return "a mapping"
	}
	return "the text"
}

// configTypes maps the names of Config's struct types (Config itself and
// every struct reachable through its fields) to the types.
func configTypes() map[string]reflect.Type {
	out := map[string]reflect.Type{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeFor[Config]().PkgPath() {
			return
		}
		if _, seen := out[t.Name()]; seen {
			return
		}
		out[t.Name()] = t
		for f := range t.Fields() {
			walk(f.Type)
		}
	}
	walk(reflect.TypeFor[Config]())
	return out
}

// yamlFields lists the YAML keys of struct type t, sorted.
func yamlFields(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
