package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

// maxExplainBody bounds the body explain reads on stdin.
const maxExplainBody = 64 << 20

func newExplainCmd(stdout io.Writer) *cobra.Command {
	var af adminFlags
	var endpoint, tenant, priority string
	cmd := &cobra.Command{
		Use:   "explain",
		Short: "Ask a running `inferrail live` where it would send a request, and why",
		Long: `explain reads a generation request body on stdin (an OpenAI chat or
completions body, as a client sends it) and posts it to POST /admin/explain:
the gateway reads, resolves and tokenizes it as its proxy does, and its
gateway core says what it would decide now, deciding nothing. It prints every
replica's state (load, engine scrape and its age, predicted cached tokens),
its admission verdict and weight, the policy's terms for each candidate (for
cost_model: queued prefill, own prefill, decode load, the guards that fired,
the estimated TTFT), the winner and why, and the shadow policy's pick when
there is one. --tenant and --priority send the headers the proxy reads.
docs/explain-shadow.md lists the terms of every policy.`,
		Example: `  inferrail explain < body.json
  inferrail explain --admin https://gw.internal:9090 --token-file admin-token --tenant team-a --priority 5 < chat.json
  echo '{"model": "llama-8b", "prompt": "Hello"}' | inferrail explain --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			if endpoint != "" && endpoint != "chat" && endpoint != "completions" && endpoint != "responses" && endpoint != "embeddings" {
				return usagef("--endpoint must be chat, completions, responses or embeddings, got %q", endpoint)
			}
			body, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxExplainBody+1))
			if err != nil {
				return fmt.Errorf("read stdin: %w", err)
			}
			if len(bytes.TrimSpace(body)) == 0 {
				return usagef("explain reads a generation request body on stdin, such as {\"model\": \"m\", \"prompt\": \"Hello\"}")
			}
			if len(body) > maxExplainBody {
				return usagef("stdin: the body exceeds %d bytes", maxExplainBody)
			}
			hdr := http.Header{}
			if tenant != "" {
				hdr.Set(live.HeaderTenant, tenant)
			}
			if priority != "" {
				hdr.Set(live.HeaderPriority, priority)
			}
			q := url.Values{}
			if endpoint != "" {
				q.Set("endpoint", endpoint)
			}
			raw, err := c.explain(cmd.Context(), q, body, hdr)
			if err != nil {
				return err
			}
			if af.json {
				_, err := stdout.Write(raw)
				return err
			}
			var ex gateway.Explanation
			if err := json.Unmarshal(raw, &ex); err != nil {
				return fmt.Errorf("admin API: the explanation does not decode: %w", err)
			}
			return printExplanation(stdout, &ex)
		},
	}
	af.register(cmd)
	cmd.Flags().StringVar(&endpoint, "endpoint", "", "chat, completions, responses or embeddings (default: completions when the body has a prompt, embeddings when it has an input, else chat)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the request's tenant, as the "+live.HeaderTenant+" header")
	cmd.Flags().StringVar(&priority, "priority", "", "the request's priority class, as the "+live.HeaderPriority+" header")
	return cmd
}

// explain posts body to /admin/explain with the proxy's headers and returns
// the answer's bytes. An answer the input caused (4xx) is bad input.
func (c *adminClient) explain(ctx context.Context, q url.Values, body []byte, hdr http.Header) ([]byte, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	u := c.base.JoinPath("/admin/explain")
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(ctx, adminCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	req.Header = hdr
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API at %s: %w (is `inferrail live` running, with admin_listen there?)", c.base.Redacted(), errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("admin API at %s: reading the answer: %w", c.base.Redacted(), err)
	}
	if resp.StatusCode >= 400 {
		var e openai.ErrorBody
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		err := fmt.Errorf("admin API: POST /admin/explain: %d: %.300s", resp.StatusCode, msg)
		if resp.StatusCode < 500 {
			return nil, usageError{err}
		}
		return nil, err
	}
	return b, nil
}

// printExplanation prints ex: a header, then one column per replica and one
// row per state field and term, then the policy-wide terms and the shadow.
func printExplanation(w io.Writer, ex *gateway.Explanation) error {
	bw := bufio.NewWriter(w)
	a := ex.Admission
	verdict := a.Verdict
	if a.Reason != "" {
		verdict += fmt.Sprintf(" (%d %s)", a.Status, a.Reason)
	}
	fmt.Fprintf(bw, "model %s  policy %s  admission %s  verdict %s\n", ex.Model, ex.Policy, a.Mode, verdict)
	r := ex.Request
	tok := "estimated from the body"
	if r.PromptKnown {
		tok = fmt.Sprintf("tokenized, %d blocks", r.PromptBlocks)
	}
	out := fmt.Sprintf("max_tokens %d (reserves %d)", r.MaxTokens, a.OutputTokens)
	if r.PrefillOnly {
		out = "an embedding (reserves no output)"
	}
	fmt.Fprintf(bw, "request: prompt %d tokens (%s), %s, priority %d, tenant %q, %d queued ahead\n",
		r.PromptTokens, tok, out, r.Priority, r.Tenant, a.QueuedAhead)
	if ex.Objective != "" {
		fmt.Fprintf(bw, "objective: %s\n", ex.Objective)
	}
	fmt.Fprintf(bw, "why: %s\n\n", ex.Why)

	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	row := func(name string, cell func(c *gateway.ExplainedCandidate) string) {
		cells := []string{name}
		for i := range ex.Candidates {
			cells = append(cells, cell(&ex.Candidates[i]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	row("replica", func(c *gateway.ExplainedCandidate) string {
		if c.Winner {
			return c.Name + " *"
		}
		return c.Name
	})
	row("eligible", func(c *gateway.ExplainedCandidate) string {
		if c.Eligible {
			return "yes"
		}
		return "no: " + c.Excluded
	})
	row("admission", func(c *gateway.ExplainedCandidate) string { return c.Admission })
	row("weight/reserved/capacity", func(c *gateway.ExplainedCandidate) string {
		return fmt.Sprintf("%d/%d/%d", c.WeightBlocks, c.ReservedBlocks, c.CapacityBlocks)
	})
	row("in_flight/pending", func(c *gateway.ExplainedCandidate) string { return fmt.Sprintf("%d/%d", c.InFlight, c.Pending) })
	row("pending_prefill_tokens", func(c *gateway.ExplainedCandidate) string { return strconv.Itoa(c.PendingPrefillTokens) })
	row("engine (age ms)", func(c *gateway.ExplainedCandidate) string {
		if c.Engine == nil {
			return "none"
		}
		return fmt.Sprintf("run %d wait %d kv %.2f (%s)", c.Engine.Running, c.Engine.Waiting, c.Engine.KVCacheUsage, num(c.Engine.AgeMs))
	})
	row("predicted_cached_tokens", func(c *gateway.ExplainedCandidate) string { return strconv.Itoa(c.PredictedCachedTokens) })
	row("indexed/active blocks", func(c *gateway.ExplainedCandidate) string {
		return fmt.Sprintf("%d/%d", c.IndexedBlocks, c.ActiveBlocks)
	})
	var names []string
	seen := map[string]bool{}
	for _, c := range ex.Candidates {
		for _, t := range c.Terms {
			if !seen[t.Name] {
				seen[t.Name] = true
				names = append(names, t.Name)
			}
		}
	}
	for _, n := range names {
		row(n, func(c *gateway.ExplainedCandidate) string {
			if v, ok := c.Term(n); ok {
				return num(v)
			}
			return "-"
		})
	}
	row("guards", func(c *gateway.ExplainedCandidate) string {
		if len(c.Guards) == 0 {
			return "-"
		}
		return strings.Join(c.Guards, ",")
	})
	row("score", func(c *gateway.ExplainedCandidate) string { return num(float64(c.Score)) })
	row("estimated_ttft_ms", func(c *gateway.ExplainedCandidate) string { return num(float64(c.EstimatedTTFTMs)) })
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ex.Terms) > 0 {
		fmt.Fprintf(bw, "\npolicy terms: %s\n", terms(ex.Terms))
	}
	if sh := ex.Shadow; sh != nil {
		agree := "disagrees"
		if sh.Agree {
			agree = "agrees"
		}
		pick, est := "", math.NaN()
		if sh.Winner >= 0 && sh.Winner < len(sh.Candidates) {
			pick, est = sh.Candidates[sh.Winner].Name, float64(sh.Candidates[sh.Winner].EstimatedTTFTMs)
		}
		fmt.Fprintf(bw, "shadow %s picks %s (%s, estimated TTFT %s ms): %s\n", sh.Policy, pick, agree, num(est), sh.Why)
	}
	return bw.Flush()
}

func terms(ts []router.Term) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.Name + " " + num(float64(t.Value))
	}
	return strings.Join(parts, ", ")
}

// num prints a term's value: integers as such, the rest with 4 significant
// digits, "-" for none.
func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'f', -1, 64)
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// explainFile is sim --explain-out's file: written under a temporary name
// beside it and moved into place when the run ends well.
type explainFile struct {
	path, tmp string
	f         *os.File
	bw        *bufio.Writer
	done      bool
}

func createExplainFile(path string) (*explainFile, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--explain-out: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return nil, fmt.Errorf("--explain-out: %w", err)
	}
	return &explainFile{path: path, tmp: f.Name(), f: f, bw: bufio.NewWriterSize(f, 1<<16)}, nil
}

func (e *explainFile) Write(p []byte) (int, error) { return e.bw.Write(p) }

// close finishes the file and moves it into place.
func (e *explainFile) close() error {
	e.done = true
	err := e.bw.Flush()
	if cerr := e.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(e.tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(e.tmp, e.path)
	}
	if err != nil {
		os.Remove(e.tmp)
		return fmt.Errorf("write explanations: %w", err)
	}
	return nil
}

// abort removes the temporary file of a run that did not reach close.
func (e *explainFile) abort() {
	if !e.done {
		e.f.Close()
		os.Remove(e.tmp)
	}
}
