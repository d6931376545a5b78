package yamlerr

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Explain rewrites the type errors of a strict decode into a value of type
// root for the user: an unknown key lists the keys allowed where it stands,
// and a value of the wrong kind says which kind is wanted, instead of
// naming Go types. Other errors pass through.
func Explain(err error, root reflect.Type) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	types := structTypes(root)
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = rewriteTypeError(m, types)
	}
	return errors.New(strings.Join(msgs, "; "))
}

var (
	unknownField = regexp.MustCompile(`^(line \d+): field (\S+) not found in type (\S+)$`)
	wrongKind    = regexp.MustCompile("^(line \\d+): cannot unmarshal !!(\\w+)(?: `(.*)`)? into (\\S+)$")
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
		switch t, ok := types[strings.TrimPrefix(want, "[]")]; {
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
		case want == "string":
			want = "text"
		case want == "bool":
			want = "true or false"
		case strings.HasPrefix(want, "[]"):
			want = "a list"
		}
		if g[2] == "seq" || g[2] == "map" {
			return fmt.Sprintf("%s: want %s, got %s", g[1], want, kindWord(g[2]))
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

// structTypes maps the names (such as "workload.W1Params") of root and of
// every struct type of root's package reachable through its fields to the
// types.
func structTypes(root reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t.PkgPath() != root.PkgPath() {
			return
		}
		if _, seen := out[t.String()]; seen {
			return
		}
		out[t.String()] = t
		for f := range t.Fields() {
			walk(f.Type)
		}
	}
	walk(root)
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
