package semcache

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// roundTrip is an http.RoundTripper of a function.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func answer(status int, body string) roundTrip {
	return func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(body)), Header: http.Header{}}, nil
	}
}

func newTestClient(t *testing.T, rt roundTrip, change func(*ClientOptions)) *Client {
	o := ClientOptions{URL: "http://embed.test:8000", Model: "e5", HTTPClient: &http.Client{Transport: rt}}
	if change != nil {
		change(&o)
	}
	c, err := NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientRequest(t *testing.T) {
	var got *http.Request
	var body map[string]any
	c := newTestClient(t, func(r *http.Request) (*http.Response, error) {
		got = r
		json.NewDecoder(r.Body).Decode(&body)
		return answer(200, `{"object":"list","data":[{"index":1,"embedding":[0,1]},{"index":0,"embedding":"AACAPwAAAAA="}]}`)(r)
	}, func(o *ClientOptions) { o.URL = "http://embed.test:8000/prefix/"; o.APIKey = "sk-1" })
	v, err := c.Embed(context.Background(), "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if got.URL.String() != "http://embed.test:8000/prefix/v1/embeddings" || got.Header.Get("Authorization") != "Bearer sk-1" {
		t.Fatalf("request %s, auth %q", got.URL, got.Header.Get("Authorization"))
	}
	if body["model"] != "e5" || body["encoding_format"] != "float" || len(body["input"].([]any)) != 2 {
		t.Fatalf("body %v", body)
	}
	// In index order; base64 read as little-endian float32 (1, 0).
	if v[0][0] != 1 || v[0][1] != 0 || v[1][0] != 0 || v[1][1] != 1 {
		t.Fatalf("vectors %v", v)
	}
}

func TestClientErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		rt     roundTrip
		dim    int
		inputs int
		want   string
	}{
		{"status", answer(503, `{"error":{"message":"model not loaded"}}`), 0, 1, "answered 503: model not loaded"},
		{"status detail", answer(404, `{"detail":"Not Found"}`), 0, 1, "answered 404: Not Found"},
		{"status text", answer(500, "\x00boom\n"), 0, 1, "boom"},
		{"not json", answer(200, `<html>`), 0, 1, "not an embeddings list"},
		{"count", answer(200, `{"data":[{"index":0,"embedding":[1]}]}`), 0, 2, "1 embeddings for 2 inputs"},
		{"index twice", answer(200, `{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[1]}]}`), 0, 2, "index 0"},
		{"index range", answer(200, `{"data":[{"index":5,"embedding":[1]}]}`), 0, 1, "index 5"},
		{"dimensions", answer(200, `{"data":[{"index":0,"embedding":[1,2,3]}]}`), 2, 1, "3 dimensions, want 2"},
		{"ragged", answer(200, `{"data":[{"index":0,"embedding":[1,2]},{"index":1,"embedding":[1]}]}`), 0, 2, "1 dimensions, want 2"},
		{"empty", answer(200, `{"data":[{"index":0,"embedding":[]}]}`), 0, 1, "empty"},
		{"strings", answer(200, `{"data":[{"index":0,"embedding":["a"]}]}`), 0, 1, "not a list of numbers"},
		{"bad base64", answer(200, `{"data":[{"index":0,"embedding":"!!"}]}`), 0, 1, "base64"},
		{"transport", func(*http.Request) (*http.Response, error) { return nil, errors.New("connection refused") }, 0, 1, "connection refused"},
	} {
		c := newTestClient(t, tc.rt, func(o *ClientOptions) { o.Dimensions = tc.dim })
		inputs := make([]string, tc.inputs)
		for i := range inputs {
			inputs[i] = "x"
		}
		if _, err := c.Embed(ctx, inputs...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestClientBounds: the body is read up to its bound, and a server that
// does not answer is given up on at the timeout (fake time).
func TestClientBounds(t *testing.T) {
	big := `{"data":[{"index":0,"embedding":[` + strings.Repeat("0.5,", 1000) + `1]}]}`
	c := newTestClient(t, answer(200, big), func(o *ClientOptions) { o.MaxResponseBytes = 1000 })
	if _, err := c.Embed(context.Background(), "x"); err == nil || !strings.Contains(err.Error(), "exceeds 1000 bytes") {
		t.Fatalf("big body: %v", err)
	}
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}, func(o *ClientOptions) { o.Timeout = 250 * time.Millisecond })
		began := time.Now()
		_, err := c.Embed(context.Background(), "x")
		if err == nil || !strings.Contains(err.Error(), "within 250ms") || time.Since(began) != 250*time.Millisecond {
			t.Fatalf("hung server: %v after %v", err, time.Since(began))
		}
	})
}

func TestNewClient(t *testing.T) {
	for _, o := range []ClientOptions{
		{URL: "", Model: "m"},
		{URL: "ftp://x", Model: "m"},
		{URL: "http://x/v1/embeddings", Model: "m"},
		{URL: "http://user:pw@x", Model: "m"},
		{URL: "http://x"},
		{URL: "http://x", Model: "m", Timeout: -1},
	} {
		if _, err := NewClient(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

func TestReadAPIKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	os.WriteFile(good, []byte("sk-abc\n"), 0o600)
	if k, err := ReadAPIKey(good); err != nil || k != "sk-abc" {
		t.Fatalf("%q %v", k, err)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("two words\n"), 0o600)
	for _, f := range []string{bad, filepath.Join(dir, "missing")} {
		if _, err := ReadAPIKey(f); err == nil {
			t.Errorf("%s accepted", f)
		}
	}
}

func FuzzParseEmbeddings(f *testing.F) {
	f.Add([]byte(`{"data":[{"index":0,"embedding":[0.1,0.2]}]}`), 1)
	f.Add([]byte(`{"data":[{"index":1,"embedding":"AACAPw=="},{"index":0,"embedding":"AACAPw=="}]}`), 2)
	f.Add([]byte(`{"data":null}`), 0)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 64 {
			return
		}
		c := &Client{}
		v, err := c.parse(b, n)
		if err != nil {
			return
		}
		if len(v) != n {
			t.Fatalf("%d vectors for %d inputs", len(v), n)
		}
		for _, x := range v {
			if len(x) == 0 || len(x) != len(v[0]) {
				t.Fatalf("vectors of %d and %d dimensions", len(x), len(v[0]))
			}
		}
	})
}
