package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// FieldError is one problem in a configuration.
type FieldError struct {
	// File is the configuration file, set by Load.
	File string
	// Line is the 1-based line of the field in the YAML (or of its
	// nearest enclosing field), 0 when unknown.
	Line int
	// Path is the field's YAML path, such as "models[1].replicas[0].url";
	// "" for the document as a whole.
	Path string
	// Msg says what is wrong and what is allowed.
	Msg string
}

// Error returns "path: msg", prefixed with "file:line: " when File is set.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// decoder walks a YAML node tree into a Config, driven by the Go types, and
// collects every problem instead of stopping at the first.
type decoder struct {
	errs   []*FieldError
	lines  map[string]int // YAML path -> line
	values int            // values decoded so far, against maxValues
}

// maxValues bounds the values one document decodes to. Aliases let a short
// document repeat a long list many times over; no real configuration comes
// near this.
const maxValues = 1 << 18

func newDecoder() *decoder { return &decoder{lines: map[string]int{}} }

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errs = append(d.errs, &FieldError{Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) joined() error {
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// line returns the line of path, or of its nearest enclosing path that the
// document holds; 0 when none.
func (d *decoder) line(path string) int {
	for path != "" {
		if l, ok := d.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// document decodes one YAML document onto c. A syntax error is returned as
// a FieldError without a path; field problems are collected in d.errs.
func (d *decoder) document(data []byte, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty document: every default, and Validate says what is missing
		}
		return syntaxError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return &FieldError{Line: extra.Line, Msg: "more than one YAML document; keep one (remove the ---)"}
	} else if !errors.Is(err, io.EOF) {
		return syntaxError(err)
	}
	n := &root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	d.value(n, "", reflect.ValueOf(c).Elem())
	return nil
}

// syntaxError turns yaml's "yaml: line N: msg" into a FieldError on line N.
func syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.Index(rest, ": "); i > 0 {
			if l, err := strconv.Atoi(rest[:i]); err == nil {
				line, msg = l, rest[i+2:]
			}
		}
	}
	return &FieldError{Line: line, Msg: "invalid YAML: " + msg}
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
)

// value decodes n into v, the field at path.
func (d *decoder) value(n *yaml.Node, path string, v reflect.Value) {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		if i > 100 {
			d.fail(n, path, "too many nested aliases")
			return
		}
		n = n.Alias
	}
	if d.values++; d.values == maxValues {
		d.fail(n, path, "the document expands to more than %d values (through aliases?); write a smaller one", maxValues)
	}
	if d.values >= maxValues {
		return
	}
	if path != "" {
		if _, ok := d.lines[path]; !ok {
			d.lines[path] = n.Line
		}
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // an empty value keeps the default
	}
	if v.CanAddr() && v.Addr().Type().Implements(unmarshalerType) {
		if err := v.Addr().Interface().(yaml.Unmarshaler).UnmarshalYAML(n); err != nil {
			d.fail(n, path, "%s", err.Error())
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.mapping(n, path, v)
	case reflect.Slice:
		d.sequence(n, path, v)
	case reflect.Map:
		d.stringMap(n, path, v)
	default:
		d.scalar(n, path, v)
	}
}

// mapping decodes a YAML mapping into the struct v.
func (d *decoder) mapping(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping of fields, got %s", kindName(n))
		return
	}
	t := v.Type()
	fields := map[string]int{}
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = i
		names = append(names, name)
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(k, path, "a key must be a plain name, got %s", kindName(k))
			continue
		}
		sub := k.Value
		if path != "" {
			sub = path + "." + k.Value
		}
		if k.Value == "<<" {
			d.fail(k, path, "merge keys (<<) are not supported; write the fields out")
			continue
		}
		if first, ok := seen[k.Value]; ok {
			d.fail(k, sub, "set twice (lines %d and %d); keep one", first, k.Line)
			continue
		}
		seen[k.Value] = k.Line
		fi, ok := fields[k.Value]
		if !ok {
			d.fail(k, sub, "unknown field; known fields here: %s", strings.Join(names, ", "))
			continue
		}
		d.lines[sub] = k.Line
		d.value(val, sub, v.Field(fi))
	}
}

// stringMap decodes a YAML mapping of names to scalars into the
// map[string]string v.
func (d *decoder) stringMap(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping of names to strings, got %s", kindName(n))
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || val.Kind != yaml.ScalarNode {
			d.fail(k, path, "want name: string pairs, got %s: %s", kindName(k), kindName(val))
			continue
		}
		if m.MapIndex(reflect.ValueOf(k.Value)).IsValid() {
			d.fail(k, path+"."+k.Value, "set twice; keep one")
			continue
		}
		m.SetMapIndex(reflect.ValueOf(k.Value), reflect.ValueOf(val.Value))
	}
	if m.Len() > 0 { // {} is no map, as the default
		v.Set(m)
	}
}

// sequence decodes a YAML sequence into the slice v; each element starts
// from its type's defaults.
func (d *decoder) sequence(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "want a list, got %s", kindName(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, e := range n.Content {
		el := s.Index(i)
		switch p := el.Addr().Interface().(type) {
		case *Model:
			*p = DefaultModel()
		case *DNSGroup:
			*p = DefaultDNSGroup()
		}
		d.value(e, path+"["+strconv.Itoa(i)+"]", el)
	}
	v.Set(s)
}

// scalar decodes a YAML scalar into v (a string, bool, integer, float or
// time.Duration), strictly: no float into an integer, no "yes" for true.
func (d *decoder) scalar(n *yaml.Node, path string, v reflect.Value) {
	want := wantName(v.Type())
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "want %s, got %s", want, kindName(n))
		return
	}
	tag := n.ShortTag()
	bad := func() { d.fail(n, path, "want %s, got %q", want, n.Value) }
	switch {
	case v.Type() == durationType:
		if tag == "!!int" && n.Value == "0" {
			v.SetInt(0)
			return
		}
		dur, err := time.ParseDuration(n.Value)
		if tag != "!!str" || err != nil {
			bad()
			return
		}
		v.SetInt(int64(dur))
	case v.Kind() == reflect.String:
		v.SetString(n.Value) // any scalar, as written: name: 2024-01-01 is a name
	case v.Kind() == reflect.Bool:
		var b bool
		if tag != "!!bool" || n.Decode(&b) != nil {
			bad()
			return
		}
		v.SetBool(b)
	case v.CanInt():
		var i int64
		if tag != "!!int" || n.Decode(&i) != nil || v.OverflowInt(i) {
			bad()
			return
		}
		v.SetInt(i)
	case v.CanUint():
		var u uint64
		if tag != "!!int" || n.Decode(&u) != nil || v.OverflowUint(u) {
			bad()
			return
		}
		v.SetUint(u)
	case v.CanFloat():
		var f float64
		if (tag != "!!int" && tag != "!!float") || n.Decode(&f) != nil {
			bad()
			return
		}
		v.SetFloat(f)
	default:
		// Unreachable for Config's types; kept so a new field type fails loudly.
		d.fail(n, path, "cannot decode into %s", v.Type())
	}
}

// wantName describes a Go type for an error message.
func wantName(t reflect.Type) string {
	switch {
	case t == durationType:
		return `a duration such as "500ms" or "10s"`
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case slices.Contains([]reflect.Kind{reflect.Int, reflect.Int64, reflect.Int32}, t.Kind()):
		return "an integer"
	case slices.Contains([]reflect.Kind{reflect.Uint, reflect.Uint64, reflect.Uint32}, t.Kind()):
		return "a non-negative integer"
	case t.Kind() == reflect.Float64:
		return "a number"
	}
	return t.String()
}

// kindName describes a YAML node for an error message.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "an alias"
}
