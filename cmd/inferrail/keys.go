package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/live/config"
)

// adminFlags are the flags of every command that talks to the admin API of
// a running `inferrail live`.
type adminFlags struct {
	admin     string
	tokenFile string
	json      bool
}

func (f *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.admin, "admin", "http://127.0.0.1:9090", "the admin API's base URL (admin_listen of inferrail live)")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "a file holding the admin bearer token (admin_token_file of inferrail live)")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the admin API's JSON answer")
}

// adminCallTimeout bounds one call to the admin API.
const adminCallTimeout = 30 * time.Second

// adminClient calls the admin API.
type adminClient struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// client checks the flags (bad ones are bad input) and returns a client.
func (f *adminFlags) client() (*adminClient, error) {
	u, err := url.Parse(f.admin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return nil, usagef("--admin must be the admin API's http:// or https:// base URL, such as http://127.0.0.1:9090, got %q", f.admin)
	}
	c := &adminClient{base: u, hc: &http.Client{Timeout: adminCallTimeout}}
	if f.tokenFile != "" {
		tok, err := config.ReadToken(f.tokenFile)
		if err != nil {
			return nil, usagef("--token-file: %v", err)
		}
		c.token = tok
	}
	return c, nil
}

// call sends one request (body marshalled as JSON when not nil) and
// decodes the answer into out (raw, when not nil, gets its bytes). An
// answer the caller's input caused (400, 401, 403, 404, 409, 413) is bad
// input (exit 2); an unreachable or failing admin API is exit 1.
func (c *adminClient) call(ctx context.Context, method, path string, query url.Values, body, out any, raw *[]byte) error {
	u := c.base.JoinPath(path)
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, adminCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API at %s: %w (is `inferrail live` running, with admin_listen there?)", c.base.Redacted(), errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin API at %s: reading the answer: %w", c.base.Redacted(), err)
	}
	if resp.StatusCode >= 400 {
		var e openai.ErrorBody
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		err := fmt.Errorf("admin API: %s %s: %d: %s", method, path, resp.StatusCode, msg)
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return usageError{fmt.Errorf("%w (give the admin token with --token-file)", err)}
		case http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusMethodNotAllowed:
			return usageError{err}
		}
		return err
	}
	if raw != nil {
		*raw = b
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("admin API: %s %s: not the expected JSON: %w", method, path, err)
		}
	}
	return nil
}

// apiKey is a key as the admin API shows it.
type apiKey struct {
	ID             string     `json:"id"`
	Key            string     `json:"key"`
	Name           string     `json:"name"`
	Priority       int        `json:"priority"`
	RPM            *int64     `json:"rpm"`
	TPM            *int64     `json:"tpm"`
	MaxConcurrency *int64     `json:"max_concurrency"`
	Models         []string   `json:"models"`
	ExpiresAt      *time.Time `json:"expires_at"`
	Disabled       bool       `json:"disabled"`
	CreatedAt      time.Time  `json:"created_at"`
}

// keyFlags are the fields create and update set.
type keyFlags struct {
	name, rpm, tpm, conc, expires string
	priority                      int
	models                        []string
	allModels, disabled           bool
}

func (f *keyFlags) register(cmd *cobra.Command, update bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "", "whose key it is, such as team-a")
	fl.IntVar(&f.priority, "priority", 0, "the key's priority class, 0 to 1000 (higher is served first; caps x-inferrail-priority)")
	fl.StringVar(&f.rpm, "rpm", "", "requests per minute, a positive integer or \"unlimited\"")
	fl.StringVar(&f.tpm, "tpm", "", "tokens per minute (prompt + completion), a positive integer or \"unlimited\"")
	fl.StringVar(&f.conc, "max-concurrency", "", "requests in flight at once, a positive integer or \"unlimited\"")
	fl.StringArrayVar(&f.models, "model", nil, "a model the key may use (repeat it; none: every model)")
	fl.StringVar(&f.expires, "expires", "", "when the key stops working: an RFC 3339 time, or a duration from now such as 720h or 30d"+map[bool]string{true: ", or \"never\"", false: ""}[update])
	fl.BoolVar(&f.disabled, "disabled", false, "the key is refused (401) until enabled (--disabled=false)")
	if update {
		fl.BoolVar(&f.allModels, "all-models", false, "let the key use every model")
	}
}

// limitValue reads --rpm and the like: a positive integer, or "unlimited"
// (null). 0 and negative numbers go to the admin API, which refuses them
// naming the field.
func limitValue(flag, v string) (any, error) {
	if v == "unlimited" || v == "none" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil, usagef("--%s must be a positive integer or \"unlimited\", got %q", flag, v)
	}
	return n, nil
}

// expiry reads --expires: an RFC 3339 time or a duration from now (Go's
// syntax, or whole days such as 30d).
func expiry(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if days, ok := strings.CutSuffix(v, "d"); ok && err != nil {
		var n int
		if n, err = strconv.Atoi(days); err == nil {
			d = time.Duration(n) * 24 * time.Hour
		}
	}
	if err != nil || d <= 0 {
		return time.Time{}, usagef("--expires must be an RFC 3339 time such as 2030-01-02T15:04:05Z or a positive duration such as 720h or 30d, got %q", v)
	}
	return now.Add(d).UTC().Truncate(time.Second), nil
}

// body is the JSON body of the flags cmd was given.
func (f *keyFlags) body(cmd *cobra.Command, now time.Time) (map[string]any, error) {
	b := map[string]any{}
	fl := cmd.Flags()
	if fl.Changed("name") {
		b["name"] = f.name
	}
	if fl.Changed("priority") {
		b["priority"] = f.priority
	}
	for flag, field := range map[string]string{"rpm": "rpm", "tpm": "tpm", "max-concurrency": "max_concurrency"} {
		if !fl.Changed(flag) {
			continue
		}
		v, err := limitValue(flag, map[string]string{"rpm": f.rpm, "tpm": f.tpm, "max-concurrency": f.conc}[flag])
		if err != nil {
			return nil, err
		}
		b[field] = v
	}
	switch {
	case fl.Changed("model") && f.allModels:
		return nil, usagef("--model and --all-models contradict each other")
	case fl.Changed("model"):
		b["models"] = f.models
	case f.allModels:
		b["models"] = nil
	}
	if fl.Changed("expires") {
		if f.expires == "never" && fl.Lookup("all-models") != nil {
			b["expires_at"] = nil
		} else {
			t, err := expiry(f.expires, now)
			if err != nil {
				return nil, err
			}
			b["expires_at"] = t.Format(time.RFC3339)
		}
	}
	if fl.Changed("disabled") {
		b["disabled"] = f.disabled
	}
	return b, nil
}

func newKeysCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Create, list, update and revoke API keys through the admin API of `inferrail live`",
		Long: `keys manages the API keys of gateways that run with auth: keys, through the
admin API on admin_listen (behind admin_token_file's bearer token). A key is
"ir-<id>-<secret>"; the store keeps only a hash of the secret, so the
plaintext is printed once, by create. Each key has a name, a priority class,
limits (requests and tokens per minute, requests in flight; unlimited by
default), the models it may use (every one by default), an expiry and a
disabled flag.`,
		Example: `  inferrail keys create --name team-a --rpm 600 --tpm 200000 --model llama-8b
  inferrail keys list
  inferrail keys update Ab3dE5gH7jK9 --rpm unlimited --priority 5
  inferrail keys revoke Ab3dE5gH7jK9
  inferrail keys list --admin https://gw.internal:9090 --token-file /etc/inferrail/admin-token`,
	}
	cmd.AddCommand(newKeysCreateCmd(stdout, stderr), newKeysListCmd(stdout), newKeysShowCmd(stdout), newKeysUpdateCmd(stdout), newKeysRevokeCmd(stdout))
	return cmd
}

func newKeysCreateCmd(stdout, stderr io.Writer) *cobra.Command {
	var af adminFlags
	var kf keyFlags
	cmd := &cobra.Command{
		Use:   "create --name NAME [flags]",
		Short: "Create a key and print its plaintext, once",
		Long: `create makes a key and prints its plaintext on stdout (alone on its line, for
scripts: KEY=$(inferrail keys create --name team-a)); the store keeps only a
hash, so it is never shown again. What else the key holds goes to stderr
(all of it, key included, to stdout with --json).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("name") {
				return usagef("--name is required: whose key it is, such as team-a")
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			body, err := kf.body(cmd, time.Now())
			if err != nil {
				return err
			}
			var k apiKey
			var raw []byte
			if err := c.call(cmd.Context(), "POST", "/admin/keys", nil, body, &k, &raw); err != nil {
				return err
			}
			if af.json {
				_, err := stdout.Write(raw)
				return err
			}
			if _, err := fmt.Fprintln(stdout, k.Key); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "created key %s (%s): %s\nthe key above is shown this once: keep it now\n", k.ID, k.Name, keySummary(k))
			return nil
		},
	}
	af.register(cmd)
	kf.register(cmd, false)
	return cmd
}

// keySummary describes a key's limits on one line.
func keySummary(k apiKey) string {
	lim := func(v *int64) string {
		if v == nil {
			return "unlimited"
		}
		return strconv.FormatInt(*v, 10)
	}
	models := "every model"
	if len(k.Models) > 0 {
		models = strings.Join(k.Models, ",")
	}
	exp := "never expires"
	if k.ExpiresAt != nil {
		exp = "expires " + k.ExpiresAt.UTC().Format(time.RFC3339)
	}
	s := fmt.Sprintf("priority %d, rpm %s, tpm %s, max_concurrency %s, %s, %s", k.Priority, lim(k.RPM), lim(k.TPM), lim(k.MaxConcurrency), models, exp)
	if k.Disabled {
		s += ", disabled"
	}
	return s
}

func newKeysListCmd(stdout io.Writer) *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the keys (never their secrets)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			var out struct {
				Data []apiKey `json:"data"`
			}
			var raw []byte
			if err := c.call(cmd.Context(), "GET", "/admin/keys", nil, nil, &out, &raw); err != nil {
				return err
			}
			if af.json {
				_, err := stdout.Write(raw)
				return err
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tPRIORITY\tRPM\tTPM\tMAX_CONCURRENCY\tMODELS\tEXPIRES\tDISABLED\tCREATED")
			for _, k := range out.Data {
				lim := func(v *int64) string {
					if v == nil {
						return "-"
					}
					return strconv.FormatInt(*v, 10)
				}
				models, exp := "*", "never"
				if len(k.Models) > 0 {
					models = strings.Join(k.Models, ",")
				}
				if k.ExpiresAt != nil {
					exp = k.ExpiresAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%v\t%s\n", k.ID, k.Name, k.Priority, lim(k.RPM), lim(k.TPM), lim(k.MaxConcurrency), models, exp, k.Disabled, k.CreatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	af.register(cmd)
	return cmd
}

func newKeysShowCmd(stdout io.Writer) *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one key (never its secret)",
		Args:  exactlyOneKeyID,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			var k apiKey
			var raw []byte
			if err := c.call(cmd.Context(), "GET", "/admin/keys/"+args[0], nil, nil, &k, &raw); err != nil {
				return err
			}
			if af.json {
				_, err := stdout.Write(raw)
				return err
			}
			_, err = fmt.Fprintf(stdout, "%s (%s): %s\n", k.ID, k.Name, keySummary(k))
			return err
		},
	}
	af.register(cmd)
	return cmd
}

func newKeysUpdateCmd(stdout io.Writer) *cobra.Command {
	var af adminFlags
	var kf keyFlags
	cmd := &cobra.Command{
		Use:   "update ID [flags]",
		Short: "Change some fields of a key (the flags given)",
		Long: `update changes the fields whose flags are given and leaves the others: --rpm
unlimited lifts a limit, --all-models lets the key use every model, --expires
never clears its expiry, --disabled (or --disabled=false) stops or restarts it.
The gateway that serves the call applies the change at once; the others within
their tenancy.auth_cache_ttl.`,
		Args: exactlyOneKeyID,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			body, err := kf.body(cmd, time.Now())
			if err != nil {
				return err
			}
			if len(body) == 0 {
				return usagef("nothing to change: give at least one of --name, --priority, --rpm, --tpm, --max-concurrency, --model, --all-models, --expires, --disabled")
			}
			var k apiKey
			var raw []byte
			if err := c.call(cmd.Context(), "PATCH", "/admin/keys/"+args[0], nil, body, &k, &raw); err != nil {
				return err
			}
			if af.json {
				_, err := stdout.Write(raw)
				return err
			}
			_, err = fmt.Fprintf(stdout, "updated %s (%s): %s\n", k.ID, k.Name, keySummary(k))
			return err
		},
	}
	af.register(cmd)
	kf.register(cmd, true)
	return cmd
}

func newKeysRevokeCmd(stdout io.Writer) *cobra.Command {
	var af adminFlags
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a key: refused from now on (within tenancy.auth_cache_ttl on other gateways); its usage stays",
		Args:  exactlyOneKeyID,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			var raw []byte
			if err := c.call(cmd.Context(), "DELETE", "/admin/keys/"+args[0], nil, nil, nil, &raw); err != nil {
				return err
			}
			if af.json {
				_, err := stdout.Write(raw)
				return err
			}
			_, err = fmt.Fprintf(stdout, "revoked %s\n", args[0])
			return err
		},
	}
	af.register(cmd)
	return cmd
}

// exactlyOneKeyID takes one argument: a key's id (never its plaintext,
// which the error would otherwise repeat).
func exactlyOneKeyID(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("%s takes one key id (the 12 characters after ir-), got %d arguments", cmd.CommandPath(), len(args))
	}
	if strings.HasPrefix(args[0], "ir-") {
		return usagef("%s takes the key's id (the 12 characters after ir-), not the key itself", cmd.CommandPath())
	}
	if strings.ContainsAny(args[0], "/?#%") || args[0] == "" {
		return usagef("%s: %q is not a key id", cmd.CommandPath(), args[0])
	}
	return nil
}
