package report

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// fmtMs formats milliseconds readably: thousands separators from 1,000 ms,
// three significant digits below.
func fmtMs(ms float64) string {
	a := math.Abs(ms)
	switch {
	case a >= 1000:
		return group(strconv.FormatFloat(ms, 'f', 0, 64))
	case a >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	case a == 0:
		return "0"
	default:
		return strconv.FormatFloat(ms, 'f', 3, 64)
	}
}

// fmtRate formats a rate in requests per second with two decimals.
func fmtRate(r float64) string { return group(strconv.FormatFloat(r, 'f', 2, 64)) }

// fmtPct formats a fraction as a percentage with one decimal.
func fmtPct(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

// fmtCount formats a count, which may be a median of counts (x.5).
func fmtCount(v float64) string {
	if v == math.Trunc(v) {
		return group(strconv.FormatFloat(v, 'f', 0, 64))
	}
	return group(strconv.FormatFloat(v, 'f', 1, 64))
}

// fmtInt formats an integer with thousands separators.
func fmtInt(n int) string { return group(strconv.Itoa(n)) }

// fmtFactor formats a ratio such as 3.4×.
func fmtFactor(f float64) string {
	if f >= 10 {
		return strconv.FormatFloat(f, 'f', 0, 64) + "×"
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + "×"
}

// fmtDuration formats a duration in ms below a second, in s above.
func fmtDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Second:
		return strconv.FormatFloat(durationMs(d), 'g', -1, 64) + " ms"
	default:
		return strconv.FormatFloat(d.Seconds(), 'g', -1, 64) + " s"
	}
}

// group inserts thousands separators into the integer part of a decimal
// number as strconv formats it.
func group(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	if len(intPart) <= 3 || strings.ContainsAny(intPart, "eE") {
		return sign + s
	}
	var b strings.Builder
	b.WriteString(sign)
	for i, ch := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if hasFrac {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return b.String()
}

// cell escapes text for a markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// code formats s as inline code.
func code(s string) string {
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}

// joinAnd joins items as "a", "a and b", "a, b and c".
func joinAnd(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// fence returns a code fence longer than any run of backticks in text.
func fence(text string) string {
	longest, run := 0, 0
	for _, ch := range text {
		if ch == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	return strings.Repeat("`", max(3, longest+1))
}
