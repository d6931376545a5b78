package fidelity

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The charts look like the benchmark report's (package report): 8x5 inches
// at 120 dots per inch, the same fonts, grid and the first two colors of its
// palette (measured blue, predicted orange). Those helpers are unexported
// there, so this file draws the two kinds of chart the check needs.
const (
	chartW     = 8 * vg.Inch
	chartH     = 5 * vg.Inch
	chartDPI   = 120
	chartPad   = vg.Length(8)
	cdfPoints  = 1000 // points drawn per CDF line
	maxScatter = 5000 // requests drawn in a scatter
)

var (
	measuredColor  = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	predictedColor = color.RGBA{0xff, 0x7f, 0x0e, 0xff}
	refColor       = color.RGBA{0x55, 0x55, 0x55, 0xff}
	gridColor      = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
)

// chart is one rendered PNG and its caption.
type chart struct {
	name, alt, caption string
	png                []byte
}

// charts renders the report's charts: the TTFT scatter, then a CDF per
// metric with data, measured and predicted side by side.
func (res *Result) charts() ([]chart, error) {
	var out []chart
	add := func(name, alt, caption string, p *plot.Plot) error {
		if p == nil {
			return nil
		}
		png, err := render(p)
		if err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		out = append(out, chart{name: name, alt: alt, caption: caption, png: png})
		return nil
	}
	if err := add("ttft_scatter.png", "predicted against measured TTFT, one dot per request",
		"Each dot is one request: measured TTFT across, predicted up (log scales). On the solid line the simulator is exact; the dashed lines are ±10%.",
		res.scatter(mTTFT)); err != nil {
		return nil, err
	}
	for _, k := range []int{mTTFT, mE2E, mTPOT, mQueue, mHit} {
		name := metricKeys[k][:len(metricKeys[k])-3] + "_cdf.png"
		if k == mHit {
			name = "hit_rate_cdf.png"
		}
		alt := metricTitles[k] + " distribution, measured and predicted"
		caption := fmt.Sprintf("The %s of the matched requests, measured and predicted.", metricTitles[k])
		if err := add(name, alt, caption, res.cdfChart(k)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.Title.Padding = vg.Points(10)
	p.X.Label.Text, p.Y.Label.Text = x, y
	for _, ax := range []*plot.Axis{&p.X, &p.Y} {
		ax.Label.TextStyle.Font.Size = vg.Points(12)
		ax.Tick.Label.Font.Size = vg.Points(10)
		ax.Label.Padding = vg.Points(4)
	}
	g := plotter.NewGrid()
	g.Horizontal.Color, g.Vertical.Color = gridColor, gridColor
	g.Horizontal.Width, g.Vertical.Width = vg.Points(0.5), vg.Points(0.5)
	p.Add(g)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.ThumbnailWidth = vg.Points(22)
	return p
}

func render(p *plot.Plot) ([]byte, error) {
	c := vgimg.NewWith(vgimg.UseWH(chartW, chartH), vgimg.UseDPI(chartDPI))
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	p.Draw(draw.Crop(dc, chartPad, -chartPad, chartPad, -chartPad))
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("encode png: %w", err)
	}
	return buf.Bytes(), nil
}

// logAxis sets a log scale on ax over [lo, hi].
func logAxis(ax *plot.Axis, lo, hi float64) {
	ax.Scale = plot.LogScale{}
	ax.Tick.Marker = logTicks{}
	ax.Min, ax.Max = lo, hi
}

// logTicks labels 1, 2 and 5 times the powers of ten (only the powers when
// the range spans more than three decades), with unlabelled minor ticks
// between.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi > lo) {
		return nil
	}
	wide := math.Log10(hi/lo) > 3
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		base := math.Pow(10, e)
		for m := 1; m < 10; m++ {
			v := float64(m) * base
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || (!wide && (m == 2 || m == 5)) {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// scatter draws predicted against measured metric k for the paired
// requests with both values positive (at most maxScatter, evenly spread
// over arrival order); nil when there are none.
func (res *Result) scatter(k int) *plot.Plot {
	var pts plotter.XYs
	for i := range res.rows {
		r := &res.rows[i]
		if r.def[k] && r.m[k] > 0 && r.p[k] > 0 {
			pts = append(pts, plotter.XY{X: r.m[k], Y: r.p[k]})
		}
	}
	if len(pts) == 0 {
		return nil
	}
	if len(pts) > maxScatter {
		thin := make(plotter.XYs, maxScatter)
		for i := range thin {
			thin[i] = pts[i*len(pts)/maxScatter]
		}
		pts = thin
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, pt := range pts {
		lo, hi = math.Min(lo, math.Min(pt.X, pt.Y)), math.Max(hi, math.Max(pt.X, pt.Y))
	}
	lo, hi = lo/1.2, hi*1.2
	p := newPlot(fmt.Sprintf("Predicted against measured %s (%d requests)", metricTitles[k], len(pts)),
		"measured "+metricTitles[k]+" (ms, log scale)", "predicted "+metricTitles[k]+" (ms, log scale)")
	logAxis(&p.X, lo, hi)
	logAxis(&p.Y, lo, hi)
	for _, f := range []float64{1, 0.9, 1.1} {
		l, err := plotter.NewLine(plotter.XYs{{X: lo, Y: lo * f}, {X: hi, Y: hi * f}})
		if err != nil {
			continue
		}
		l.LineStyle = draw.LineStyle{Color: refColor, Width: vg.Points(1.2)}
		if f != 1 {
			l.LineStyle.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(l)
		if f == 1 {
			p.Legend.Add("predicted = measured", l)
		} else if f > 1 {
			p.Legend.Add("±10%", l)
		}
	}
	s, err := plotter.NewScatter(pts)
	if err != nil {
		return nil
	}
	s.GlyphStyle = draw.GlyphStyle{Color: color.NRGBA{0x1f, 0x77, 0xb4, 0x90}, Radius: vg.Points(1.6), Shape: draw.CircleGlyph{}}
	p.Add(s)
	p.Legend.Add("request", s)
	return p
}

// cdfOf returns up to cdfPoints points of the empirical CDF of vals (only
// positive values with a log axis).
func cdfOf(vals []float64, positive bool) plotter.XYs {
	s := make([]float64, 0, len(vals))
	for _, v := range vals {
		if !math.IsInf(v, 0) && !math.IsNaN(v) && (!positive || v > 0) {
			s = append(s, v)
		}
	}
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return nil
	}
	pts := plotter.XYs{{X: s[0], Y: 0}}
	step := max(1, n/cdfPoints)
	for i := 0; i < n; i += step {
		pts = append(pts, plotter.XY{X: s[i], Y: float64(i+1) / float64(n)})
	}
	if last := pts[len(pts)-1]; last.Y < 1 {
		pts = append(pts, plotter.XY{X: s[n-1], Y: 1})
	}
	return pts
}

// cdfChart draws metric k's measured and predicted CDFs over the matched
// requests; nil when a side has no positive value (a queue that never
// waited).
func (res *Result) cdfChart(k int) *plot.Plot {
	var mv, pv []float64
	for i := range res.rows {
		r := &res.rows[i]
		if r.def[k] {
			mv, pv = append(mv, r.m[k]), append(pv, r.p[k])
		}
	}
	logX := k != mHit
	m, pr := cdfOf(mv, logX), cdfOf(pv, logX)
	if len(m) == 0 || len(pr) == 0 {
		return nil
	}
	xl := metricTitles[k] + " (ms, log scale)"
	if !logX {
		xl = "hit rate (cached share of the prompt)"
	}
	title := fmt.Sprintf("%s distribution: measured and predicted (%d requests)", metricTitles[k], len(mv))
	if logX && (len(m) < len(mv) || len(pr) < len(pv)) {
		title = fmt.Sprintf("%s distribution of the requests with a positive %s", metricTitles[k], metricTitles[k])
	}
	p := newPlot(title, xl, "fraction of requests ≤ x")
	if logX {
		lo := math.Min(m[0].X, pr[0].X) / 1.1
		hi := math.Max(m[len(m)-1].X, pr[len(pr)-1].X) * 1.1
		logAxis(&p.X, lo, hi)
	} else {
		p.X.Min, p.X.Max = 0, 1
	}
	p.Y.Min, p.Y.Max = 0, 1
	for _, side := range []struct {
		name string
		pts  plotter.XYs
		clr  color.Color
		dash []vg.Length
	}{{"measured", m, measuredColor, nil}, {"predicted", pr, predictedColor, []vg.Length{vg.Points(6), vg.Points(3)}}} {
		l, err := plotter.NewLine(side.pts)
		if err != nil {
			continue
		}
		l.LineStyle = draw.LineStyle{Color: side.clr, Width: vg.Points(1.6), Dashes: side.dash}
		p.Add(l)
		p.Legend.Add(side.name, l)
	}
	return p
}
