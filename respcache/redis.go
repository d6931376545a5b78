package respcache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisStore keeps entries in Redis, shared by every gateway that uses the
// same server and key prefix: one string per entry, key_prefix followed by
// the key in hex, its value one binary blob (a version byte first, see
// entry.go), written with SET ... PX ttl. Redis bounds the bytes: run it
// with maxmemory and maxmemory-policy allkeys-lru (CheckEviction says
// whether it does). Each call is bounded by redis.timeout.
type RedisStore struct {
	c       redis.UniversalClient
	prefix  string
	timeout time.Duration
	own     bool // Close closes c
}

var (
	_ Store       = (*RedisStore)(nil)
	_ remoteStore = (*RedisStore)(nil)
)

// NewRedisStore uses c (its Options need ContextTimeoutEnabled, or
// cfg.Timeout could not bound a call) with cfg's key prefix and timeout.
// Close leaves c open: it is the caller's.
func NewRedisStore(c redis.UniversalClient, cfg RedisConfig) (*RedisStore, error) {
	if c == nil {
		return nil, errors.New("respcache: redis store without a client")
	}
	if !contextTimeouts(c) {
		return nil, errors.New("respcache: the redis client needs ContextTimeoutEnabled: true, or redis.timeout cannot bound a call")
	}
	if cfg.KeyPrefix == "" {
		return nil, errors.New("respcache: redis key prefix must not be empty")
	}
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("respcache: redis timeout must be positive, got %v", cfg.Timeout)
	}
	return &RedisStore{c: c, prefix: cfg.KeyPrefix, timeout: cfg.Timeout}, nil
}

// DialRedis returns a client of cfg.Addr (host:port or unix:///path):
// lazily connected (go-redis dials on the first call and redials by itself
// after a failure), each call bounded by its context.
func DialRedis(cfg RedisConfig) (*redis.Client, error) {
	if msg := checkRedisAddr(cfg.Addr); msg != "" {
		return nil, fmt.Errorf("respcache: redis.addr %s", msg)
	}
	opt := &redis.Options{
		Network: "tcp", Addr: cfg.Addr,
		ContextTimeoutEnabled: true,
		// No maintenance-notification handshake: a hosted-Redis feature
		// that Debian's server does not know.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		DialTimeout:              time.Second,
	}
	if path, ok := strings.CutPrefix(cfg.Addr, "unix://"); ok {
		opt.Network, opt.Addr = "unix", path
	}
	return redis.NewClient(opt), nil
}

func contextTimeouts(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true // other implementations: their business
}

// Remote reports true: the Cache stores off the request path.
func (s *RedisStore) Remote() bool { return true }

// RedisKey is the Redis key of k: key_prefix and k in hex.
func (s *RedisStore) RedisKey(k Key) string { return s.prefix + k.String() }

// Get reads k's entry (GET); a value that is not an entry of k under this
// encoding version is an error wrapping ErrCorrupt.
func (s *RedisStore) Get(ctx context.Context, k Key) (*Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	b, err := s.c.Get(ctx, s.RedisKey(k)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("respcache: redis get: %w", err)
	}
	e, err := decodeEntry(k, b)
	if err != nil {
		return nil, fmt.Errorf("respcache: redis get: %w", err)
	}
	return e, nil
}

// Set writes e under k: SET key blob PX ttl-in-milliseconds.
func (s *RedisStore) Set(ctx context.Context, k Key, e *Entry, ttl time.Duration) error {
	if err := e.validate(); err != nil {
		return err
	}
	ms := ttl.Milliseconds()
	if ms <= 0 {
		return fmt.Errorf("respcache: ttl must be at least 1ms, got %v", ttl)
	}
	blob := appendEntry(make([]byte, 0, encodedSize(e)), k, e)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.c.Do(ctx, "SET", s.RedisKey(k), blob, "PX", ms).Err(); err != nil {
		return fmt.Errorf("respcache: redis set: %w", err)
	}
	return nil
}

// CheckEviction asks the server (CONFIG GET) whether it bounds its memory
// and evicts any key to make room (maxmemory > 0, maxmemory-policy
// allkeys-lru or allkeys-lfu). Without that a full Redis refuses writes
// (noeviction) or evicts only keys with a TTL (volatile-*), which every
// cache entry has but the other users of the server may not. An error
// says what is wrong, or that the server does not allow CONFIG (managed
// Redis often does not): the caller logs it as a startup note.
func (s *RedisStore) CheckEviction(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	mm, err := s.c.ConfigGet(ctx, "maxmemory").Result()
	if err != nil {
		return fmt.Errorf("respcache: redis config get maxmemory: %w", err)
	}
	pol, err := s.c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return fmt.Errorf("respcache: redis config get maxmemory-policy: %w", err)
	}
	n, err := strconv.ParseInt(mm["maxmemory"], 10, 64)
	if err != nil {
		return fmt.Errorf("respcache: redis maxmemory %q: %w", mm["maxmemory"], err)
	}
	if n <= 0 {
		return errors.New("respcache: redis has no maxmemory: the response cache grows until the server runs out of memory; set maxmemory and maxmemory-policy allkeys-lru")
	}
	switch p := pol["maxmemory-policy"]; p {
	case "allkeys-lru", "allkeys-lfu":
		return nil
	default:
		return fmt.Errorf("respcache: redis maxmemory-policy is %q: set allkeys-lru so that a full server evicts the least recently used entries", p)
	}
}

// Close closes the client when the store dialed it itself (New with
// store: redis and no Deps.Redis).
func (s *RedisStore) Close() error {
	if !s.own {
		return nil
	}
	return s.c.Close()
}
