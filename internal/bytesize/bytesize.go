// Package bytesize is the one byte-size type of the configuration files
// (live's, the response cache's): an integer number of bytes, or a number
// and a unit. Start at Size.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Size is a number of bytes. In YAML it is an integer, or a string of a
// number and a unit: B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB
// (powers of 1024), such as "4MiB".
type Size int64

// Units.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
)

// String writes b in the largest binary unit that divides it, such as
// "32MiB", else in bytes.
func (b Size) String() string {
	for _, u := range []struct {
		n    Size
		name string
	}{{GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if b != 0 && b%u.n == 0 {
			return strconv.FormatInt(int64(b/u.n), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// UnmarshalYAML reads an integer or a size string such as "4MiB".
func (b *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf(`want a size in bytes such as 4194304 or "4MiB", got %s`, kind(n))
	}
	if n.ShortTag() == "!!int" {
		var v int64
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("want a size in bytes, got %q (too large)", n.Value)
		}
		*b = Size(v)
		return nil
	}
	if n.ShortTag() != "!!str" {
		return fmt.Errorf(`want a size in bytes such as 4194304 or "4MiB", got %q`, n.Value)
	}
	v, err := Parse(n.Value)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// Parse reads a size such as "4194304", "4096KiB", "4MiB" or "1GB".
func Parse(orig string) (Size, error) {
	s := strings.TrimSpace(orig)
	units := []struct {
		suffix string
		n      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	num := s
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			mult, num = u.n, strings.TrimSpace(rest)
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v > (1<<62)/mult || v < -(1<<62)/mult {
		return 0, fmt.Errorf(`want a size in bytes such as 4194304 or "4MiB" (units B, KB, MB, GB, KiB, MiB, GiB), got %q`, orig)
	}
	return Size(v * mult), nil
}

func kind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return "an alias"
}
