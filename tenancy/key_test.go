package tenancy

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"math/big"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// The format secret scanners are told about.
var keyPattern = regexp.MustCompile(`^ir-[0-9A-Za-z]{12}-[0-9A-Za-z]{43}$`)

func TestNewKey(t *testing.T) {
	k, plain, err := NewKey("team a", now)
	if err != nil {
		t.Fatal(err)
	}
	if !keyPattern.MatchString(plain) || len(plain) != APIKeyLen {
		t.Fatalf("plaintext %q does not match %v", plain, keyPattern)
	}
	id, secret, err := ParseAPIKey(plain)
	if err != nil {
		t.Fatal(err)
	}
	if id != k.ID || !k.Verify(secret) {
		t.Errorf("ParseAPIKey gives id %q (key %q), Verify %v", id, k.ID, k.Verify(secret))
	}
	sum := sha256.Sum256([]byte(secret))
	if !bytes.Equal(k.SecretHash, sum[:]) {
		t.Error("SecretHash is not SHA-256 of the secret")
	}
	if strings.Contains(string(k.SecretHash), secret) || k.Name != "team a" || !k.CreatedAt.Equal(now) {
		t.Errorf("unexpected key %+v", k)
	}
	if _, _, err := NewKey("", now); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewKey with no name: %v, want ErrInvalid", err)
	}
	k2, plain2, _ := NewKey("team a", now)
	if k2.ID == k.ID || plain2 == plain {
		t.Error("two keys are the same")
	}
}

// The secret encodes all 32 bytes: distinct inputs give distinct secrets,
// and decoding the base62 digits gives the bytes back.
func TestEncodeSecret(t *testing.T) {
	for _, b := range [][]byte{make([]byte, 32), bytes.Repeat([]byte{0xff}, 32), append(make([]byte, 31), 1)} {
		s := encodeSecret(b)
		if len(s) != SecretLen || firstNonBase62(s) >= 0 {
			t.Fatalf("encodeSecret(%x) = %q", b, s)
		}
		n := new(big.Int)
		for i := 0; i < len(s); i++ {
			n.Mul(n, big.NewInt(62))
			n.Add(n, big.NewInt(int64(strings.IndexByte(base62, s[i]))))
		}
		if got := n.FillBytes(make([]byte, 32)); !bytes.Equal(got, b) {
			t.Errorf("decode(encodeSecret(%x)) = %x", b, got)
		}
	}
}

// Property: NewKey's plaintext parses back to its id and a secret that
// verifies, whatever the random bytes; any other secret does not verify.
func TestNewKeyRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.SliceOfN(rapid.Byte(), 256, 256).Draw(t, "random")
		k, plain, err := newKey(bytes.NewReader(seed), "k", now)
		if err != nil {
			t.Skip("not enough bytes below 248 for the id") // rejection sampling ran dry
		}
		id, secret, err := ParseAPIKey(plain)
		if err != nil {
			t.Fatalf("ParseAPIKey(%q): %v", plain, err)
		}
		if id != k.ID || KeyPrefix+id+"-"+secret != plain || !k.Verify(secret) {
			t.Fatalf("round trip failed: %q -> %q %q", plain, id, secret)
		}
		// Change one character of the secret.
		i := rapid.IntRange(0, SecretLen-1).Draw(t, "pos")
		c := rapid.SampledFrom([]byte(base62)).Filter(func(c byte) bool { return c != secret[i] }).Draw(t, "char")
		other := secret[:i] + string(c) + secret[i+1:]
		if k.Verify(other) {
			t.Fatalf("Verify accepts a changed secret %q", other)
		}
		if err := k.Validate(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestParseAPIKeyErrors(t *testing.T) {
	_, good, _ := NewKey("x", now)
	for _, tc := range []struct {
		in, want string
	}{
		{"", "empty"},
		{"sk-" + good[3:], `does not start with "ir-"`},
		{"IR-" + good[3:], `does not start with "ir-"`},
		{good[:20], "20 characters, want 59"},
		{good + "x", "60 characters, want 59"},
		{" " + good[:58], `does not start with "ir-"`},
		{good[:58] + "\n", "secret has a character outside [0-9A-Za-z] at position 59"},
		{good[:5] + "_" + good[6:], "id has a character outside [0-9A-Za-z] at position 6"},
		{good[:15] + "_" + good[16:], "want '-' after the 12-character id at position 16"},
		{good[:30] + "-" + good[31:], "secret has a character outside [0-9A-Za-z] at position 31"},
		{good[:40] + "é" + good[42:], "secret has a character outside [0-9A-Za-z] at position 41"},
		{"Bearer " + good[:52], `does not start with "ir-"`},
	} {
		_, _, err := ParseAPIKey(tc.in)
		if !errors.Is(err, ErrMalformedKey) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseAPIKey(%q): %v, want ErrMalformedKey with %q", tc.in, err, tc.want)
		}
		if len(tc.in) > 8 && strings.Contains(err.Error(), tc.in[3:12]) {
			t.Errorf("error %q repeats the key", err)
		}
	}
}

func FuzzParseAPIKey(f *testing.F) {
	_, good, _ := newKey(bytes.NewReader(bytes.Repeat([]byte{7, 200, 33, 150}, 64)), "f", now)
	for _, s := range []string{good, "", "ir-", "ir-" + strings.Repeat("a", 12) + "-" + strings.Repeat("b", 43), good[:58] + "\x00", "ir-aaaaaaaaaaaa_" + good[16:]} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, secret, err := ParseAPIKey(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedKey) {
				t.Fatalf("error %v does not wrap ErrMalformedKey", err)
			}
			if len(s) >= 8 && strings.Contains(err.Error(), s) {
				t.Fatalf("error %q repeats the input", err)
			}
			if id != "" || secret != "" {
				t.Fatal("an error with an id or secret")
			}
			return
		}
		if !ValidID(id) || len(secret) != SecretLen || firstNonBase62(secret) >= 0 || KeyPrefix+id+"-"+secret != s {
			t.Fatalf("ParseAPIKey(%q) = %q, %q", s, id, secret)
		}
		k := Key{ID: id, SecretHash: HashSecret(secret)}
		if !k.Verify(secret) {
			t.Fatal("Verify fails on its own hash")
		}
	})
}

func TestVerify(t *testing.T) {
	k, plain, _ := NewKey("x", now)
	_, secret, _ := ParseAPIKey(plain)
	for _, tc := range []struct {
		name   string
		k      Key
		secret string
		want   bool
	}{
		{"right", k, secret, true},
		{"empty", k, "", false},
		{"short", k, secret[:42], false},
		{"long", k, secret + "a", false},
		{"no hash", Key{ID: k.ID}, secret, false},
		{"short hash", Key{ID: k.ID, SecretHash: k.SecretHash[:16]}, secret, false},
	} {
		if got := tc.k.Verify(tc.secret); got != tc.want {
			t.Errorf("%s: Verify = %v", tc.name, got)
		}
	}
}

func TestAllows(t *testing.T) {
	k, _, _ := NewKey("x", now)
	if err := k.Allows("any", now); err != nil {
		t.Errorf("a key with no models and no expiry: %v", err)
	}
	k.Models = []string{"a", "b"}
	if err := k.Allows("b", now); err != nil {
		t.Error(err)
	}
	err := k.Allows("c", now)
	if !errors.Is(err, ErrModelNotAllowed) || HTTPStatus(err) != http.StatusForbidden || !strings.Contains(err.Error(), `"c"`) {
		t.Errorf("model c: %v (status %d)", err, HTTPStatus(err))
	}
	if err := k.Allows("B", now); !errors.Is(err, ErrModelNotAllowed) {
		t.Errorf("models are case-sensitive: %v", err)
	}
	k.ExpiresAt = now.Add(time.Second)
	if err := k.Allows("a", now); err != nil {
		t.Errorf("before expiry: %v", err)
	}
	err = k.Allows("a", now.Add(time.Second))
	if !errors.Is(err, ErrKeyExpired) || HTTPStatus(err) != http.StatusUnauthorized {
		t.Errorf("at expiry: %v (status %d)", err, HTTPStatus(err))
	}
	// Disabled comes first, then expired, then the model.
	k.Disabled = true
	err = k.Allows("c", now.Add(time.Hour))
	if !errors.Is(err, ErrKeyDisabled) || HTTPStatus(err) != http.StatusUnauthorized {
		t.Errorf("disabled: %v (status %d)", err, HTTPStatus(err))
	}
	k.Disabled = false
	if err := k.Allows("c", now.Add(time.Hour)); !errors.Is(err, ErrKeyExpired) {
		t.Errorf("expired and model not allowed: %v, want expired", err)
	}
}

func TestHTTPStatus(t *testing.T) {
	_, _, malformed := ParseAPIKey("nope")
	for err, want := range map[error]int{
		nil:                   0,
		malformed:             401,
		ErrInvalidKey:         401,
		ErrKeyDisabled:        401,
		ErrKeyExpired:         401,
		ErrModelNotAllowed:    403,
		Key{}.Validate():      400,
		ErrNotFound:           404,
		ErrExists:             409,
		ErrUnavailable:        503,
		errors.New("db down"): 500,
	} {
		if got := HTTPStatus(err); got != want {
			t.Errorf("HTTPStatus(%v) = %d, want %d", err, got, want)
		}
	}
}

func validKey(t *testing.T) Key {
	t.Helper()
	k, _, err := NewKey("valid", now)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestValidate(t *testing.T) {
	if err := validKey(t).Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mutate func(*Key)
		want   string
	}{
		{func(k *Key) { k.RPM = -5 }, "rpm: must be 0 (unlimited) or a positive integer, got -5"},
		{func(k *Key) { k.RPM = MaxRPM + 1 }, "rpm: must be at most 1000000000, got 1000000001"},
		{func(k *Key) { k.TPM = -1 }, "tpm: must be 0 (unlimited) or a positive integer, got -1"},
		{func(k *Key) { k.TPM = MaxTPM + 1 }, "tpm: must be at most"},
		{func(k *Key) { k.MaxConcurrency = -3 }, "max_concurrency: must be 0 (unlimited) or a positive integer, got -3"},
		{func(k *Key) { k.Priority = -1 }, "priority: must be between 0 and 1000, got -1"},
		{func(k *Key) { k.Priority = 1001 }, "priority: must be between 0 and 1000, got 1001"},
		{func(k *Key) { k.Name = "" }, "name: must not be empty"},
		{func(k *Key) { k.Name = "\t " }, "name: must not be empty"},
		{func(k *Key) { k.Name = strings.Repeat("n", 129) }, "name: must be at most 128 bytes, got 129"},
		{func(k *Key) { k.Name = "bad\xff" }, "name: must be valid UTF-8"},
		{func(k *Key) { k.Name = "line\nbreak" }, "name: must not contain control characters"},
		{func(k *Key) { k.ID = "abc" }, "id: must be 12 characters of [0-9A-Za-z]"},
		{func(k *Key) { k.ID = "abcdefghijk-" }, "id: must be 12 characters"},
		{func(k *Key) { k.SecretHash = []byte("short") }, "secret_hash: must be 32 bytes (SHA-256), got 5"},
		{func(k *Key) { k.Models = []string{"ok", ""} }, "models[1]: must not be empty"},
		{func(k *Key) { k.Models = []string{"has space"} }, `models[0]: must not contain spaces or control characters, got "has space"`},
		{func(k *Key) { k.Models = []string{"tab\there"} }, "models[0]: must not contain spaces"},
		{func(k *Key) { k.Models = []string{strings.Repeat("m", 257)} }, "models[0]: must be at most 256 bytes, got 257"},
		{func(k *Key) { k.Models = []string{"x", "y", "x"} }, `models[2]: duplicate model "x"`},
		{func(k *Key) { k.Models = make([]string, MaxModels+1) }, "models: at most 256 models, got 257"},
		{func(k *Key) { k.ExpiresAt = time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC) }, "expires_at: must be between 1970 and 9999"},
	} {
		k := validKey(t)
		tc.mutate(&k)
		err := k.Validate()
		if !errors.Is(err, ErrInvalid) || err.Error() != tc.want && !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want %q", err, tc.want)
			continue
		}
		fes := FieldErrors(err)
		if len(fes) != 1 || !strings.HasPrefix(tc.want, fes[0].Field+":") {
			t.Errorf("FieldErrors(%v) = %v", err, fes)
		}
	}
	// Several problems: each named.
	k := validKey(t)
	k.RPM, k.TPM, k.Name = -1, -2, ""
	fes := FieldErrors(k.Validate())
	var fields []string
	for _, fe := range fes {
		fields = append(fields, fe.Field)
	}
	if strings.Join(fields, ",") != "name,rpm,tpm" {
		t.Errorf("fields %v, want name,rpm,tpm", fields)
	}
	// Wrapped errors still give their fields.
	if got := FieldErrors(errors.Join(errors.New("x"), &FieldError{Field: "f", Msg: "m"})); len(got) != 1 {
		t.Errorf("FieldErrors through a join: %v", got)
	}
}

func TestPatch(t *testing.T) {
	k := validKey(t)
	k.Models = []string{"a"}
	if !(KeyPatch{}).Empty() {
		t.Error("the zero patch is not empty")
	}
	name, rpm, models, exp, dis := "n", int64(9), []string{"b", "c"}, time.Time{}, true
	p := KeyPatch{Name: &name, RPM: &rpm, Models: &models, ExpiresAt: &exp, Disabled: &dis}
	if p.Empty() {
		t.Error("a patch is empty")
	}
	got := p.Apply(k)
	if got.Name != "n" || got.RPM != 9 || len(got.Models) != 2 || !got.Disabled || got.TPM != k.TPM || got.ID != k.ID {
		t.Errorf("Apply: %+v", got)
	}
	models[0] = "changed"
	if got.Models[0] != "b" {
		t.Error("Apply shares the patch's models slice")
	}
	if k.Models[0] != "a" || k.Name != "valid" {
		t.Error("Apply changed its input")
	}
}

func TestNormalizeTime(t *testing.T) {
	if !NormalizeTime(time.Time{}).IsZero() {
		t.Error("zero is not kept")
	}
	in := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("X", 3600))
	got := NormalizeTime(in)
	if got.Location() != time.UTC || got.Nanosecond() != 123456000 || !got.Equal(in.Truncate(time.Microsecond)) {
		t.Errorf("NormalizeTime(%v) = %v", in, got)
	}
}

func TestRandomBase62Uniform(t *testing.T) {
	// Every character appears, in about the right proportion.
	r := bytes.NewReader(bytes.Repeat(func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}(), 100))
	s, err := randomBase62(r, 62*4*25)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[rune]int{}
	for _, c := range s {
		counts[c]++
	}
	if len(counts) != 62 {
		t.Fatalf("%d distinct characters, want 62", len(counts))
	}
	for c, n := range counts {
		if n != 100 {
			t.Errorf("%c appears %d times of %d, want 100 (bytes 0..247 map evenly)", c, n, len(s))
		}
	}
	if _, err := randomBase62(bytes.NewReader(nil), 12); err == nil {
		t.Error("no error from an empty reader")
	}
}
