package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The golden files are written by scripts/chat-fixtures/run.sh (Python
// Jinja2 as transformers configures it, on requests converted as vLLM
// converts them). Regenerate them with that script, not from Go.

type parityFile struct {
	Renderer        string            `json:"renderer"`
	FixtureDate     string            `json:"fixture_date"`
	ContentFormats  map[string]string `json:"content_formats"`
	CustomTemplates map[string]string `json:"custom_templates"`
	Cases           []struct {
		Template string          `json:"template"`
		Name     string          `json:"name"`
		Request  json.RawMessage `json:"request"`
		Text     *string         `json:"text"`
		Error    string          `json:"error"`
	} `json:"cases"`
}

// sharedDir walks up from the package directory to the project's shared
// folder (../shared next to the repository); "" when absent.
func sharedDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		cand := filepath.Join(dir, "shared", "tokenizers")
		if st, err := os.Stat(cand); err == nil && st.IsDir() {
			return filepath.Join(dir, "shared")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func loadParity(t testing.TB) parityFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "parity.json"))
	if err != nil {
		t.Fatalf("read golden file: %v (regenerate with scripts/chat-fixtures/run.sh)", err)
	}
	pf, err := parseParity(data)
	if err != nil {
		t.Fatalf("parse testdata/parity.json: %v", err)
	}
	return pf
}

func parseParity(data []byte) (parityFile, error) {
	var pf parityFile
	err := json.Unmarshal(data, &pf)
	return pf, err
}

func fixtureClock(t testing.TB, date string) func() time.Time {
	t.Helper()
	if date == "" {
		return nil
	}
	d, err := time.Parse("2006-01-02", date)
	if err != nil {
		t.Fatalf("fixture_date %q: %v", date, err)
	}
	return func() time.Time { return d }
}

// loadTemplates compiles every template the golden file uses: models' from
// the shared tokenizer configs, the rest from the golden file itself.
func loadTemplates(t testing.TB, pf parityFile) map[string]*Template {
	t.Helper()
	shared := sharedDir()
	out := map[string]*Template{}
	for name := range pf.ContentFormats {
		var tmpl *Template
		if src, ok := pf.CustomTemplates[name]; ok {
			var err error
			tmpl, err = New(src, Options{BosToken: "<s>", EosToken: "</s>", Now: fixtureClock(t, pf.FixtureDate)})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		} else {
			if shared == "" {
				t.Skip("shared/tokenizers not found next to the repository: the parity test needs the models' tokenizer_config.json files")
			}
			data, err := os.ReadFile(filepath.Join(shared, "tokenizers", name, "tokenizer_config.json"))
			if err != nil {
				t.Skipf("tokenizer config for %s absent (%v): skipping parity", name, err)
			}
			src, toolUse, opts, err := ParseTokenizerConfig(data)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			opts.Now = fixtureClock(t, pf.FixtureDate)
			if tmpl, err = NewWithToolUse(src, toolUse, opts); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		out[name] = tmpl
	}
	return out
}

func TestParityWithJinja2(t *testing.T) {
	pf := loadParity(t)
	templates := loadTemplates(t, pf)
	perTemplate := map[string][2]int{}
	for _, c := range pf.Cases {
		tmpl := templates[c.Template]
		ok := t.Run(c.Template+"/"+c.Name, func(t *testing.T) {
			if got := tmpl.ContentFormat().String(); got != pf.ContentFormats[c.Template] {
				t.Errorf("content format %s, vLLM detects %s", got, pf.ContentFormats[c.Template])
			}
			req, err := ParseRequest(c.Request)
			var out string
			if err == nil {
				out, err = tmpl.Render(req)
			}
			if c.Text == nil {
				if err == nil {
					t.Fatalf("rendered %q; Jinja2 failed with %s", out, c.Error)
				}
				if msg, found := strings.CutPrefix(c.Error, "TemplateError: "); found {
					var te *TemplateError
					if !errors.As(err, &te) || te.Message != msg {
						t.Fatalf("error %v; want raise_exception(%q)", err, msg)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("render: %v; Jinja2 rendered %q", err, *c.Text)
			}
			if out != *c.Text {
				t.Fatalf("render differs from Jinja2 at byte %d:\n got %q\nwant %q", firstDiff(out, *c.Text), out, *c.Text)
			}
		})
		n := perTemplate[c.Template]
		n[1]++
		if ok {
			n[0]++
		}
		perTemplate[c.Template] = n
	}
	for name, n := range perTemplate {
		t.Logf("%s: %d/%d cases identical to %s", name, n[0], n[1], pf.Renderer)
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestWhitespaceParity checks the whitespace pre-pass against Jinja2 on
// hand-written and randomly assembled templates (trim markers, trim_blocks,
// lstrip_blocks, comments, raw blocks, CRLF).
func TestWhitespaceParity(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "whitespace.json"))
	if err != nil {
		t.Fatalf("read golden file: %v (regenerate with scripts/chat-fixtures/run.sh)", err)
	}
	var wf struct {
		Context json.RawMessage `json:"context"`
		Cases   []struct {
			Name     string  `json:"name"`
			Template string  `json:"template"`
			Text     *string `json:"text"`
			Error    string  `json:"error"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &wf); err != nil {
		t.Fatal(err)
	}
	req := Request{ChatTemplateKwargs: wf.Context}
	checked := 0
	for _, c := range wf.Cases {
		if c.Text == nil {
			continue // Jinja2 rejects it; the engine may be more lenient.
		}
		checked++
		tmpl, err := New(c.Template, Options{})
		if err != nil {
			t.Errorf("%s: compile %q: %v", c.Name, c.Template, err)
			continue
		}
		got, err := tmpl.Render(req)
		if err != nil {
			t.Errorf("%s: render %q: %v", c.Name, c.Template, err)
			continue
		}
		if got != *c.Text {
			t.Errorf("%s: template %q\n got %q\nwant %q", c.Name, c.Template, got, *c.Text)
		}
	}
	if checked < 100 {
		t.Fatalf("only %d whitespace cases rendered by Jinja2; regenerate testdata", checked)
	}
}
