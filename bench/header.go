package bench

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// ownHeaders are the headers bench writes itself, which Config.Header may
// not replace: the body's type and framing, and the server's name.
var ownHeaders = []string{"Content-Type", "Content-Length", "Host", "Transfer-Encoding"}

// ParseHeader reads one header of Config.Header given as "Name: value", as
// curl's -H takes it: a name that is an HTTP token and not one of bench's
// own (Content-Type, Content-Length, Host, Transfer-Encoding), a colon, then
// a value that is not empty and holds no control character but tab (spaces
// around the value are dropped). The name comes back in canonical form.
func ParseHeader(s string) (name, value string, err error) {
	name, value, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", fmt.Errorf("%q: want Name: value, e.g. \"X-Team: search\"", s)
	}
	value = strings.Trim(value, " \t")
	if err := checkField(name, value); err != nil {
		return "", "", fmt.Errorf("%q: %w", s, err)
	}
	name = http.CanonicalHeaderKey(name)
	if err := checkOwn(name); err != nil {
		return "", "", fmt.Errorf("%q: %w", s, err)
	}
	return name, value, nil
}

// checkOwn refuses a header bench writes itself.
func checkOwn(name string) error {
	if slices.Contains(ownHeaders, name) {
		return fmt.Errorf("header %s: bench sets it itself and it may not be replaced", name)
	}
	return nil
}

// checkField checks one header's name and value.
func checkField(name, value string) error {
	if name == "" {
		return errors.New("no header name before the colon")
	}
	for i := range len(name) {
		if !isTokenByte(name[i]) {
			return fmt.Errorf("header name %q: %q is not allowed in a name (letters, digits and !#$%%&'*+-.^_`|~ only, no space before the colon)", name, name[i])
		}
	}
	if value == "" {
		return fmt.Errorf("header %s has no value", name)
	}
	for i := range len(value) {
		if b := value[i]; b < ' ' && b != '\t' || b == 0x7f {
			return fmt.Errorf("header %s: its value holds a control character (%q)", name, b)
		}
	}
	return nil
}

// checkHeader checks Config.Header: well-formed names and values in
// canonical form, none of bench's own, and no Authorization beside an API
// key.
func checkHeader(h http.Header, apiKey bool) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(h)) {
		vs := h[name]
		if name != http.CanonicalHeaderKey(name) {
			errs = append(errs, fmt.Errorf("header %q: not in canonical form (%q; http.Header.Add makes it)", name, http.CanonicalHeaderKey(name)))
			continue
		}
		if err := checkOwn(name); err != nil {
			errs = append(errs, err)
		}
		if name == "Authorization" && apiKey {
			errs = append(errs, errors.New("header Authorization and an API key: give one of them"))
		}
		if len(vs) == 0 {
			errs = append(errs, fmt.Errorf("header %s has no value", name))
		}
		for _, v := range vs {
			if err := checkField(name, v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// isTokenByte reports whether b may appear in an HTTP token (RFC 9110
// tchar).
func isTokenByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}
