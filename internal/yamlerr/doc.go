// Package yamlerr turns the errors of a strict YAML decode (go.yaml.in/yaml/v3
// with KnownFields) into messages in the YAML's own terms: Explain, given
// the type decoded into, names the keys allowed beside an unknown one and
// the kind of value a field wants. The workload configuration and the
// engine profile use it; live's configuration has a decoder of its own
// (live/config) that reports every problem with its path.
package yamlerr
