package tenancy

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The plaintext API key is
//
//	ir-<id>-<secret>
//
// with a 12-character base62 public id and a 43-character base62 secret
// that encodes 32 bytes from crypto/rand (62^43 > 2^256, so 43 characters
// hold any 32 bytes). Both parts are [0-9A-Za-z] only, so a double click
// selects the whole key, and the fixed "ir-" prefix with fixed lengths lets
// secret scanners match it: ir-[0-9A-Za-z]{12}-[0-9A-Za-z]{43}.
const (
	// KeyPrefix starts every plaintext API key.
	KeyPrefix = "ir-"
	// IDLen is the length of a key's public id.
	IDLen = 12
	// SecretLen is the length of the encoded secret.
	SecretLen = 43
	// SecretBytes is the entropy of a secret.
	SecretBytes = 32
	// APIKeyLen is the length of a plaintext API key.
	APIKeyLen = len(KeyPrefix) + IDLen + 1 + SecretLen
	// HashLen is the length of Key.SecretHash (SHA-256).
	HashLen = sha256.Size
)

// Bounds that Key.Validate enforces. They keep the limiter's arithmetic far
// from overflow and the admin API's inputs small.
const (
	// MaxPriority is the highest priority class, the gateway core's
	// gateway.MaxPriorityLimit (a test checks they agree).
	MaxPriority = 1000
	// MaxRPM bounds Key.RPM.
	MaxRPM = 1_000_000_000
	// MaxTPM bounds Key.TPM.
	MaxTPM = 1_000_000_000_000
	// MaxConcurrencyLimit bounds Key.MaxConcurrency.
	MaxConcurrencyLimit = 1_000_000
	// MaxNameLen bounds Key.Name, in bytes.
	MaxNameLen = 128
	// MaxModels bounds len(Key.Models).
	MaxModels = 256
	// MaxModelLen bounds a model name, in bytes.
	MaxModelLen = 256
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// Key is an API key as stored: its public id and a hash of its secret,
// never the secret. The proxy authenticates a request by parsing the
// plaintext key (ParseAPIKey), looking the id up (Cache) and checking the
// secret (Verify), then checks the request against the key (Allows).
type Key struct {
	// ID is the public id: in logs, metrics, usage rows and the admin API.
	ID string `json:"id"`
	// Name says whose key it is (non-empty, at most MaxNameLen bytes).
	Name string `json:"name"`
	// SecretHash is SHA-256 of the secret as it appears in the plaintext
	// key. The secret is 32 bytes from crypto/rand, so it cannot be
	// guessed and a fast hash is the right one (TensorZero does the
	// same): a slow password hash (bcrypt, argon2) only protects secrets
	// people choose, and would cost milliseconds on every cache miss.
	SecretHash []byte `json:"-"`
	// Priority is the key's priority class in the gateway core's queue
	// (higher is served first), 0..MaxPriority.
	Priority int `json:"priority"`
	// RPM limits requests per minute; 0 is unlimited.
	RPM int64 `json:"rpm"`
	// TPM limits tokens per minute; 0 is unlimited.
	TPM int64 `json:"tpm"`
	// MaxConcurrency limits requests in flight; 0 is unlimited.
	MaxConcurrency int `json:"max_concurrency"`
	// Models lists the models the key may use; empty allows all.
	Models []string `json:"models,omitempty"`
	// ExpiresAt is when the key stops working; zero is never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Disabled keys are rejected (401) until enabled again.
	Disabled bool `json:"disabled"`
	// CreatedAt and UpdatedAt are set by the store.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Errors of authentication and authorization; HTTPStatus maps them.
var (
	// ErrMalformedKey: the string is not an API key of this format.
	ErrMalformedKey = errors.New("malformed api key")
	// ErrInvalidKey: no key has this id, or the secret is wrong (one
	// error for both, so a client cannot probe which ids exist).
	ErrInvalidKey = errors.New("invalid api key")
	// ErrKeyExpired: the key's ExpiresAt has passed.
	ErrKeyExpired = errors.New("api key expired")
	// ErrKeyDisabled: the key is disabled.
	ErrKeyDisabled = errors.New("api key disabled")
	// ErrModelNotAllowed: the key may not use the requested model.
	ErrModelNotAllowed = errors.New("model not allowed for this api key")
	// ErrUnavailable: the key store failed and nothing usable was cached
	// (Cache); the request fails closed.
	ErrUnavailable = errors.New("key store unavailable")
)

// NewKey makes a key with a fresh random id and secret, created at now,
// with no limits, and returns it with its plaintext form, which the caller
// shows once and never stores. Set the limits on the Key before
// Store.CreateKey.
func NewKey(name string, now time.Time) (Key, string, error) {
	return newKey(rand.Reader, name, now)
}

func newKey(r io.Reader, name string, now time.Time) (Key, string, error) {
	id, err := randomBase62(r, IDLen)
	if err != nil {
		return Key{}, "", fmt.Errorf("new key id: %w", err)
	}
	var raw [SecretBytes]byte
	if _, err := io.ReadFull(r, raw[:]); err != nil {
		return Key{}, "", fmt.Errorf("new key secret: %w", err)
	}
	secret := encodeSecret(raw[:])
	sum := sha256.Sum256([]byte(secret))
	now = NormalizeTime(now)
	k := Key{ID: id, Name: name, SecretHash: sum[:], CreatedAt: now, UpdatedAt: now}
	if err := k.Validate(); err != nil {
		return Key{}, "", err
	}
	return k, KeyPrefix + id + "-" + secret, nil
}

// randomBase62 draws n characters of base62 uniformly (rejection sampling:
// bytes of 248 and above are dropped, 248 = 4 x 62).
func randomBase62(r io.Reader, n int) (string, error) {
	out := make([]byte, 0, n)
	var buf [32]byte
	for len(out) < n {
		if _, err := io.ReadFull(r, buf[:]); err != nil {
			return "", err
		}
		for _, b := range buf {
			if b < 248 && len(out) < n {
				out = append(out, base62[b%62])
			}
		}
	}
	return string(out), nil
}

// encodeSecret writes b (SecretBytes bytes) as SecretLen base62 digits,
// most significant first, zero-padded.
func encodeSecret(b []byte) string {
	n := new(big.Int).SetBytes(b)
	out := make([]byte, SecretLen)
	base, mod := big.NewInt(62), new(big.Int)
	for i := SecretLen - 1; i >= 0; i-- {
		n.DivMod(n, base, mod)
		out[i] = base62[mod.Int64()]
	}
	return string(out)
}

func isBase62(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
}

// firstNonBase62 returns the index of the first character of s outside
// [0-9A-Za-z], or -1.
func firstNonBase62(s string) int {
	for i := 0; i < len(s); i++ {
		if !isBase62(s[i]) {
			return i
		}
	}
	return -1
}

// ValidID reports whether id has the form of a key's public id.
func ValidID(id string) bool { return len(id) == IDLen && firstNonBase62(id) < 0 }

// ParseAPIKey splits a plaintext API key into its public id and secret. It
// is strict (no trimming, no other prefixes or lengths) and its errors,
// which wrap ErrMalformedKey, never repeat the input, so they are safe to
// log and to return to the client.
func ParseAPIKey(s string) (id, secret string, err error) {
	switch {
	case s == "":
		return "", "", fmt.Errorf("%w: empty", ErrMalformedKey)
	case !strings.HasPrefix(s, KeyPrefix):
		return "", "", fmt.Errorf("%w: does not start with %q", ErrMalformedKey, KeyPrefix)
	case len(s) != APIKeyLen:
		return "", "", fmt.Errorf("%w: %d characters, want %d", ErrMalformedKey, len(s), APIKeyLen)
	}
	id = s[len(KeyPrefix) : len(KeyPrefix)+IDLen]
	if i := firstNonBase62(id); i >= 0 {
		return "", "", fmt.Errorf("%w: id has a character outside [0-9A-Za-z] at position %d", ErrMalformedKey, len(KeyPrefix)+i+1)
	}
	sep := len(KeyPrefix) + IDLen
	if s[sep] != '-' {
		return "", "", fmt.Errorf("%w: want '-' after the %d-character id at position %d", ErrMalformedKey, IDLen, sep+1)
	}
	secret = s[sep+1:]
	if i := firstNonBase62(secret); i >= 0 {
		return "", "", fmt.Errorf("%w: secret has a character outside [0-9A-Za-z] at position %d", ErrMalformedKey, sep+2+i)
	}
	return id, secret, nil
}

// HashSecret returns SHA-256 of the secret (what Key.SecretHash holds).
func HashSecret(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// Verify reports whether secret is this key's secret, comparing hashes in
// constant time.
func (k Key) Verify(secret string) bool {
	if len(secret) != SecretLen || len(k.SecretHash) != HashLen {
		return false
	}
	// Copy into a fixed array so the hash input stays on the stack.
	var buf [SecretLen]byte
	copy(buf[:], secret)
	sum := sha256.Sum256(buf[:])
	return subtle.ConstantTimeCompare(sum[:], k.SecretHash) == 1
}

// Allows checks that the key may serve a request for model at now: it
// returns an error wrapping ErrKeyDisabled, ErrKeyExpired or
// ErrModelNotAllowed (checked in that order), or nil.
func (k Key) Allows(model string, now time.Time) error {
	if k.Disabled {
		return fmt.Errorf("key %s: %w", k.ID, ErrKeyDisabled)
	}
	if !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt) {
		return fmt.Errorf("key %s: %w at %s", k.ID, ErrKeyExpired, k.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if len(k.Models) > 0 && !slices.Contains(k.Models, model) {
		return fmt.Errorf("key %s: %w: %q", k.ID, ErrModelNotAllowed, model)
	}
	return nil
}

// HTTPStatus maps this package's errors to the status the proxy and the
// admin API answer with: 401 for a malformed, unknown, wrong, expired or
// disabled key, 403 for a model the key may not use, 400 for invalid
// input, 404 and 409 for the admin API's not found and already exists, 503
// when the key store is unavailable, and 500 for anything else (0 for nil).
func HTTPStatus(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrMalformedKey), errors.Is(err, ErrInvalidKey),
		errors.Is(err, ErrKeyExpired), errors.Is(err, ErrKeyDisabled):
		return http.StatusUnauthorized
	case errors.Is(err, ErrModelNotAllowed):
		return http.StatusForbidden
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrExists):
		return http.StatusConflict
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// ErrInvalid is matched (errors.Is) by every FieldError: the input is
// invalid and the message says which field and why.
var ErrInvalid = errors.New("invalid input")

// FieldError is one invalid field: Error returns "field: msg", such as
// "rpm: must be 0 (unlimited) or a positive integer, got -5".
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// FieldErrors returns the FieldErrors in err (a joined error from Validate,
// possibly wrapped), in order.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks every field and returns the problems as *FieldErrors
// joined with errors.Join (nil when the key is valid).
func (k Key) Validate() error {
	var errs []error
	add := func(e *FieldError) { errs = append(errs, e) }
	if !ValidID(k.ID) {
		add(fieldErr("id", "must be %d characters of [0-9A-Za-z]", IDLen))
	}
	if err := validateName(k.Name); err != nil {
		add(err)
	}
	if len(k.SecretHash) != HashLen {
		add(fieldErr("secret_hash", "must be %d bytes (SHA-256), got %d", HashLen, len(k.SecretHash)))
	}
	if k.Priority < 0 || k.Priority > MaxPriority {
		add(fieldErr("priority", "must be between 0 and %d, got %d", MaxPriority, k.Priority))
	}
	if e := validateLimit("rpm", k.RPM, MaxRPM); e != nil {
		add(e)
	}
	if e := validateLimit("tpm", k.TPM, MaxTPM); e != nil {
		add(e)
	}
	if e := validateLimit("max_concurrency", int64(k.MaxConcurrency), MaxConcurrencyLimit); e != nil {
		add(e)
	}
	errs = append(errs, validateModels(k.Models)...)
	if !k.ExpiresAt.IsZero() {
		if y := k.ExpiresAt.UTC().Year(); y < 1970 || y > 9999 {
			add(fieldErr("expires_at", "must be between 1970 and 9999 (or unset for never), got year %d", y))
		}
	}
	return errors.Join(errs...)
}

func validateLimit(field string, v, limit int64) *FieldError {
	switch {
	case v < 0:
		return fieldErr(field, "must be 0 (unlimited) or a positive integer, got %d", v)
	case v > limit:
		return fieldErr(field, "must be at most %d, got %d", limit, v)
	}
	return nil
}

func validateName(name string) *FieldError {
	switch {
	case strings.TrimSpace(name) == "":
		return fieldErr("name", "must not be empty")
	case len(name) > MaxNameLen:
		return fieldErr("name", "must be at most %d bytes, got %d", MaxNameLen, len(name))
	case !utf8.ValidString(name):
		return fieldErr("name", "must be valid UTF-8")
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return fieldErr("name", "must not contain control characters")
	}
	return nil
}

func validateModels(models []string) []error {
	if len(models) > MaxModels {
		return []error{fieldErr("models", "at most %d models, got %d", MaxModels, len(models))}
	}
	var errs []error
	seen := make(map[string]bool, len(models))
	for i, m := range models {
		field := "models[" + strconv.Itoa(i) + "]"
		if e := validateModel(field, m); e != nil {
			errs = append(errs, e)
			continue
		}
		if seen[m] {
			errs = append(errs, fieldErr(field, "duplicate model %q", m))
		}
		seen[m] = true
	}
	return errs
}

// validateModel checks a model name: 1..MaxModelLen bytes of UTF-8 with
// no spaces or control characters (names like "Qwen/Qwen2.5-7B-Instruct"
// or "llama3:8b" pass).
func validateModel(field, m string) *FieldError {
	switch {
	case m == "":
		return fieldErr(field, "must not be empty")
	case len(m) > MaxModelLen:
		return fieldErr(field, "must be at most %d bytes, got %d", MaxModelLen, len(m))
	case !utf8.ValidString(m):
		return fieldErr(field, "must be valid UTF-8")
	case strings.IndexFunc(m, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fieldErr(field, "must not contain spaces or control characters, got %q", m)
	}
	return nil
}

// NormalizeTime returns t in UTC truncated to the microsecond (what both
// stores keep); the zero time stays zero.
func NormalizeTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Microsecond)
}

// Normalized returns k as a store keeps it: times in UTC to the
// microsecond, Models nil when empty (else a copy), SecretHash a copy.
func (k Key) Normalized() Key {
	k.ExpiresAt = NormalizeTime(k.ExpiresAt)
	k.CreatedAt = NormalizeTime(k.CreatedAt)
	k.UpdatedAt = NormalizeTime(k.UpdatedAt)
	if len(k.Models) == 0 {
		k.Models = nil
	} else {
		k.Models = slices.Clone(k.Models)
	}
	k.SecretHash = slices.Clone(k.SecretHash)
	return k
}

// KeyPatch changes some fields of a key (Store.UpdateKey): nil fields stay
// as they are. A zero *ExpiresAt clears the expiry; an empty *Models
// allows every model.
type KeyPatch struct {
	Name           *string    `json:"name,omitempty"`
	Priority       *int       `json:"priority,omitempty"`
	RPM            *int64     `json:"rpm,omitempty"`
	TPM            *int64     `json:"tpm,omitempty"`
	MaxConcurrency *int       `json:"max_concurrency,omitempty"`
	Models         *[]string  `json:"models,omitempty"`
	ExpiresAt      *time.Time `json:"expires_at,omitempty"`
	Disabled       *bool      `json:"disabled,omitempty"`
}

// Empty reports whether the patch changes nothing.
func (p KeyPatch) Empty() bool { return p == KeyPatch{} }

// Apply returns k with the patch applied (not validated, UpdatedAt
// unchanged).
func (p KeyPatch) Apply(k Key) Key {
	if p.Name != nil {
		k.Name = *p.Name
	}
	if p.Priority != nil {
		k.Priority = *p.Priority
	}
	if p.RPM != nil {
		k.RPM = *p.RPM
	}
	if p.TPM != nil {
		k.TPM = *p.TPM
	}
	if p.MaxConcurrency != nil {
		k.MaxConcurrency = *p.MaxConcurrency
	}
	if p.Models != nil {
		k.Models = slices.Clone(*p.Models)
	}
	if p.ExpiresAt != nil {
		k.ExpiresAt = *p.ExpiresAt
	}
	if p.Disabled != nil {
		k.Disabled = *p.Disabled
	}
	return k
}
