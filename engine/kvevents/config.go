package kvevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Publisher kinds, as vLLM names them.
const (
	PublisherZMQ  = "zmq"
	PublisherNull = "null"
)

// Config is vLLM's KVEventsConfig, the --kv-events-config JSON object.
type Config struct {
	EnableKVCacheEvents bool `json:"enable_kv_cache_events"`
	// Publisher is "zmq" or "null"; when the JSON omits it, it is "zmq" if
	// events are enabled and "null" otherwise (vLLM's rule).
	Publisher string `json:"publisher"`
	// Endpoint is where events are published (default "tcp://*:5557"). The
	// publisher binds when it contains "*" or "::" or is ipc:// or
	// inproc://, and connects otherwise (see Binds).
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint is where the ROUTER answering replay requests binds
	// (always binds, as in vLLM); "" (JSON null, the default) disables replay.
	ReplayEndpoint string `json:"replay_endpoint"`
	// BufferSteps is how many recent batches are kept for replay (10000).
	BufferSteps int `json:"buffer_steps"`
	// HWM is the PUB socket's send high-water mark in messages (100000).
	HWM int `json:"hwm"`
	// MaxQueueSize bounds the batches waiting to be sent (100000); Publish
	// drops and counts batches beyond it.
	MaxQueueSize int `json:"max_queue_size"`
	// Topic is sent as the first frame of every message ("").
	Topic string `json:"topic"`
	// Format is not part of vLLM's JSON: it selects the event encoding the
	// Publisher sends (FormatMap, the default, as current vLLM does).
	Format Format `json:"-"`
	// ForceBind is not part of vLLM's JSON: it makes the Publisher bind
	// Endpoint even where vLLM's rule (see Binds) would connect, e.g. to
	// bind tcp://127.0.0.1:0 in tests.
	ForceBind bool `json:"-"`
	// LegacyReplay is not part of vLLM's JSON: it makes the replay ROUTER
	// answer as vLLM did before 0.26, without the topic frame (["", seq,
	// payload] per batch, ["", -1, ""] at the end, as a DEALER sees them),
	// for consumers written against that shape. By default it answers as
	// vLLM 0.26 (PR #45177) and llm-d-inference-sim do, with the topic
	// before the seq (["", topic, seq, payload], then ["", "", -1, ""]);
	// llm-d's replay client accepts only that shape, and Subscriber reads
	// both.
	LegacyReplay bool `json:"-"`
}

// DefaultConfig returns vLLM's defaults with events enabled on zmq.
func DefaultConfig() Config {
	return Config{
		EnableKVCacheEvents: true,
		Publisher:           PublisherZMQ,
		Endpoint:            "tcp://*:5557",
		BufferSteps:         10000,
		HWM:                 100000,
		MaxQueueSize:        100000,
		Format:              FormatMap,
	}
}

// rawConfig mirrors the JSON with pointers, to tell "absent" from "zero".
type rawConfig struct {
	EnableKVCacheEvents *bool   `json:"enable_kv_cache_events"`
	Publisher           *string `json:"publisher"`
	Endpoint            *string `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	BufferSteps         *int    `json:"buffer_steps"`
	HWM                 *int    `json:"hwm"`
	MaxQueueSize        *int    `json:"max_queue_size"`
	Topic               *string `json:"topic"`
}

// ParseConfig parses vLLM's --kv-events-config JSON, fills vLLM's defaults
// for absent keys and validates the result. Unknown keys are rejected.
func ParseConfig(data []byte) (Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var raw rawConfig
	if err := dec.Decode(&raw); err != nil {
		if strings.Contains(err.Error(), "unknown field") {
			return Config{}, fmt.Errorf("kvevents: --kv-events-config: %w (known keys: enable_kv_cache_events, publisher, endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic)", err)
		}
		return Config{}, fmt.Errorf("kvevents: --kv-events-config: want a JSON object: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("kvevents: --kv-events-config: text after the JSON object: pass exactly one object")
	}
	c := DefaultConfig()
	c.EnableKVCacheEvents = false
	c.Publisher = ""
	if raw.EnableKVCacheEvents != nil {
		c.EnableKVCacheEvents = *raw.EnableKVCacheEvents
	}
	setStr(&c.Publisher, raw.Publisher)
	setStr(&c.Endpoint, raw.Endpoint)
	setStr(&c.ReplayEndpoint, raw.ReplayEndpoint)
	setStr(&c.Topic, raw.Topic)
	setInt(&c.BufferSteps, raw.BufferSteps)
	setInt(&c.HWM, raw.HWM)
	setInt(&c.MaxQueueSize, raw.MaxQueueSize)
	if c.Publisher == "" {
		c.Publisher = PublisherNull
		if c.EnableKVCacheEvents {
			c.Publisher = PublisherZMQ
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func setStr(dst *string, v *string) {
	if v != nil {
		*dst = *v
	}
}

func setInt(dst *int, v *int) {
	if v != nil {
		*dst = *v
	}
}

// Validate checks the config; NewPublisher calls it.
func (c Config) Validate() error {
	switch c.Publisher {
	case PublisherZMQ, PublisherNull:
	default:
		return fmt.Errorf("kvevents: publisher %q: use %q or %q", c.Publisher, PublisherZMQ, PublisherNull)
	}
	if c.Format != FormatMap && c.Format != FormatArray {
		return fmt.Errorf("kvevents: format %d: use FormatMap or FormatArray", c.Format)
	}
	if !c.EnableKVCacheEvents || c.Publisher == PublisherNull {
		return nil
	}
	if err := checkEndpoint("endpoint", c.Endpoint); err != nil {
		return err
	}
	if c.ReplayEndpoint != "" {
		if err := checkEndpoint("replay_endpoint", c.ReplayEndpoint); err != nil {
			return err
		}
	}
	if c.BufferSteps < 0 {
		return fmt.Errorf("kvevents: buffer_steps %d: must be 0 or more", c.BufferSteps)
	}
	if c.HWM < 0 {
		return fmt.Errorf("kvevents: hwm %d: must be 0 (unlimited) or more", c.HWM)
	}
	if c.MaxQueueSize < 1 {
		return fmt.Errorf("kvevents: max_queue_size %d: must be at least 1", c.MaxQueueSize)
	}
	return nil
}

func checkEndpoint(key, ep string) error {
	switch {
	case strings.HasPrefix(ep, "tcp://"):
		hp := strings.TrimPrefix(ep, "tcp://")
		i := strings.LastIndex(hp, ":")
		if i < 0 {
			return fmt.Errorf("kvevents: %s %q has no port: write tcp://HOST:PORT", key, ep)
		}
		if p, err := strconv.Atoi(hp[i+1:]); err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("kvevents: %s %q: port must be a number in [0, 65535]", key, ep)
		}
		return nil
	case strings.HasPrefix(ep, "ipc://"), strings.HasPrefix(ep, "inproc://"):
		return nil
	}
	return fmt.Errorf("kvevents: %s %q: must start with tcp://, ipc:// or inproc://", key, ep)
}

// Binds reports whether vLLM binds (rather than connects) a publisher on ep:
// it binds when ep contains "*" or "::" or is ipc:// or inproc://.
// Config.ForceBind makes the Publisher bind an endpoint this rule would
// connect, such as tcp://127.0.0.1:0.
func Binds(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// EndpointForRank applies vLLM's per-rank endpoint convention: data-parallel
// rank r publishes on the base port + r (tcp) or on the endpoint with
// "_dp<r>" appended (ipc, inproc); rank 0 uses ep unchanged.
func EndpointForRank(ep string, rank int) (string, error) {
	if rank < 0 {
		return "", fmt.Errorf("kvevents: data-parallel rank %d: must be 0 or more", rank)
	}
	if ep == "" || rank == 0 {
		return ep, nil
	}
	switch {
	case strings.HasPrefix(ep, "ipc://"), strings.HasPrefix(ep, "inproc://"):
		return fmt.Sprintf("%s_dp%d", ep, rank), nil
	case strings.HasPrefix(ep, "tcp://"):
		i := strings.LastIndex(ep, ":")
		port, err := strconv.Atoi(ep[i+1:])
		if i < len("tcp://") || err != nil {
			return "", fmt.Errorf("kvevents: endpoint %q has no numeric port: write tcp://HOST:PORT", ep)
		}
		if port+rank > 65535 {
			return "", fmt.Errorf("kvevents: endpoint %q: port %d + rank %d exceeds 65535: lower the base port", ep, port, rank)
		}
		return fmt.Sprintf("%s:%d", ep[:i], port+rank), nil
	}
	return "", fmt.Errorf("kvevents: endpoint %q: must start with tcp://, ipc:// or inproc://", ep)
}
