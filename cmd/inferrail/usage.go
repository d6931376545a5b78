package main

import (
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// usageRow is one row of GET /admin/usage: a key's use of a model in one
// hour.
type usageRow struct {
	KeyID           string    `json:"key_id"`
	Model           string    `json:"model"`
	Hour            time.Time `json:"hour"`
	Requests        int64     `json:"requests"`
	PromptTokens    int64     `json:"prompt_tokens"`
	CachedTokens    int64     `json:"cached_tokens"`
	OutputTokens    int64     `json:"output_tokens"`
	Errors          int64     `json:"errors"`
	QueueSeconds    float64   `json:"queue_seconds"`
	TTFTSeconds     float64   `json:"ttft_seconds"`
	DurationSeconds float64   `json:"duration_seconds"`
}

// sinceValue reads --since and --until: an RFC 3339 time, or a duration
// before now (Go's syntax, or whole days such as 7d).
func sinceValue(flag, v string, now time.Time) (string, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t.UTC().Format(time.RFC3339), nil
	}
	d, err := time.ParseDuration(v)
	if days, ok := strings.CutSuffix(v, "d"); ok && err != nil {
		var n int
		if n, err = strconv.Atoi(days); err == nil {
			d = time.Duration(n) * 24 * time.Hour
		}
	}
	if err != nil || d < 0 {
		return "", usagef("--%s must be an RFC 3339 time such as 2030-01-02T15:04:05Z or a duration before now such as 24h or 7d, got %q", flag, v)
	}
	return now.Add(-d).UTC().Format(time.RFC3339), nil
}

func newUsageCmd(stdout io.Writer) *cobra.Command {
	var af adminFlags
	var since, until, key, model string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Print usage per key, model and hour from the admin API of `inferrail live`",
		Long: `usage prints what each key used of each model, per hour: requests (errors
among them: requests admitted that did not end with a whole answer), prompt,
cached and output tokens, and the average queue time, time to first token and
duration. The gateway that answers writes its pending rows first; the others'
show after their tenancy.usage_flush_interval. With auth: none, the key is
"anonymous". --since and --until take an RFC 3339 time or a duration before
now (24h, 7d); by default every row is printed.`,
		Example: `  inferrail usage --since 24h
  inferrail usage --key Ab3dE5gH7jK9 --model llama-8b --json
  inferrail usage --since 2030-01-01T00:00:00Z --until 2030-02-01T00:00:00Z --admin https://gw.internal:9090 --token-file admin-token`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			q := url.Values{}
			now := time.Now()
			for flag, v := range map[string]string{"since": since, "until": until} {
				if !cmd.Flags().Changed(flag) {
					continue
				}
				t, err := sinceValue(flag, v, now)
				if err != nil {
					return err
				}
				q.Set(flag, t)
			}
			if key != "" {
				q.Set("key", key)
			}
			if model != "" {
				q.Set("model", model)
			}
			var out struct {
				Data []usageRow `json:"data"`
			}
			var raw []byte
			if err := c.call(cmd.Context(), "GET", "/admin/usage", q, nil, &out, &raw); err != nil {
				return err
			}
			if af.json {
				_, err := stdout.Write(raw)
				return err
			}
			return printUsage(stdout, out.Data)
		},
	}
	af.register(cmd)
	cmd.Flags().StringVar(&since, "since", "", "rows from this hour on: an RFC 3339 time or a duration before now (24h, 7d)")
	cmd.Flags().StringVar(&until, "until", "", "rows before this time: an RFC 3339 time or a duration before now")
	cmd.Flags().StringVar(&key, "key", "", "one key's rows (its id; anonymous with auth: none)")
	cmd.Flags().StringVar(&model, "model", "", "one model's rows")
	return cmd
}

// printUsage writes rows as a table with a total line.
func printUsage(w io.Writer, rows []usageRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "HOUR\tKEY\tMODEL\tREQUESTS\tERRORS\tPROMPT\tCACHED\tOUTPUT\tQUEUE_AVG_S\tTTFT_AVG_S\tDURATION_AVG_S\t")
	var total usageRow
	line := func(hour, key, model string, u usageRow) {
		avg := func(sum float64) string {
			if u.Requests == 0 {
				return "-"
			}
			return strconv.FormatFloat(sum/float64(u.Requests), 'f', 3, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", hour, key, model, u.Requests, u.Errors, u.PromptTokens, u.CachedTokens, u.OutputTokens,
			avg(u.QueueSeconds), avg(u.TTFTSeconds), avg(u.DurationSeconds))
	}
	for _, u := range rows {
		line(u.Hour.UTC().Format("2006-01-02T15Z"), u.KeyID, u.Model, u)
		total.Requests += u.Requests
		total.Errors += u.Errors
		total.PromptTokens += u.PromptTokens
		total.CachedTokens += u.CachedTokens
		total.OutputTokens += u.OutputTokens
		total.QueueSeconds += u.QueueSeconds
		total.TTFTSeconds += u.TTFTSeconds
		total.DurationSeconds += u.DurationSeconds
	}
	line("total", "", strconv.Itoa(len(rows))+" rows", total)
	return tw.Flush()
}
