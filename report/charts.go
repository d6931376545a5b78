package report

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Chart file names, in the order the report shows them.
const (
	chartTTFTCDF         = "ttft_cdf.png"
	chartTTFTBars        = "ttft_bars.png"
	chartHitRate         = "hit_rate.png"
	chartReplicaRequests = "replica_requests.png"
	chartReplicaBusy     = "replica_busy.png"
	chartSweepTTFT       = "sweep_ttft_p99.png"
	chartSweepGoodput    = "sweep_goodput.png"
	chartCapacity        = "capacity.png"
)

// cdfPoints caps the points drawn per CDF line.
const cdfPoints = 1000

// chart is one rendered PNG.
type chart struct {
	name string
	png  []byte
}

// chartSet renders the charts of one input.
type chartSet struct {
	in     Input
	aggs   []policyAgg
	styles styles
	words  words
	out    []chart
}

// renderCharts renders every chart the input has data for.
func renderCharts(in Input) ([]chart, error) {
	cs := &chartSet{
		in:     in,
		aggs:   aggregate(in.Runs, policyOrder(in.Runs)),
		styles: styles{policies: allPolicies(in)},
		words:  wordsOf(in),
	}
	steps := []struct {
		name string
		fn   func() (*plot.Plot, *plot.Legend, bool)
	}{
		{chartTTFTCDF, cs.ttftCDF},
		{chartTTFTBars, cs.ttftBars},
		{chartHitRate, cs.hitRate},
		{chartReplicaRequests, func() (*plot.Plot, *plot.Legend, bool) { return cs.replicas(false) }},
		{chartReplicaBusy, func() (*plot.Plot, *plot.Legend, bool) { return cs.replicas(true) }},
		{chartSweepTTFT, func() (*plot.Plot, *plot.Legend, bool) { return cs.sweep(false) }},
		{chartSweepGoodput, func() (*plot.Plot, *plot.Legend, bool) { return cs.sweep(true) }},
		{chartCapacity, cs.capacity},
	}
	for _, s := range steps {
		p, leg, ok := s.fn()
		if !ok {
			continue
		}
		png, err := render(p, leg)
		if err != nil {
			return nil, fmt.Errorf("report: chart %s: %w", s.name, err)
		}
		cs.out = append(cs.out, chart{name: s.name, png: png})
	}
	return cs.out, nil
}

// plotWidth estimates the width left for data beside a legend.
func plotWidth(leg *plot.Legend) vg.Length {
	w := chartW - 2*margin - vg.Inch
	if leg != nil {
		r := leg.Rectangle(draw.Canvas{})
		w -= r.Max.X - r.Min.X + 2*margin
	}
	return w
}

// policyNames lists the aggregates' policies.
func policyNames(aggs []policyAgg) []string {
	names := make([]string, len(aggs))
	for i, a := range aggs {
		names[i] = a.Policy
	}
	return names
}

// lineStyle is a policy's line.
func lineStyle(s policyStyle) draw.LineStyle {
	return draw.LineStyle{Color: s.Color, Width: vg.Points(1.6), Dashes: s.Dashes}
}

// refColor is the color of reference lines (SLO, even split, y = x).
func refColor() color.Color { return gray(0x55) }

// refLine is a dash-dotted reference line.
func refLine(xys plotter.XYs, clr color.Color) (*plotter.Line, error) {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return nil, err
	}
	l.LineStyle = draw.LineStyle{Color: clr, Width: vg.Points(1.4), Dashes: []vg.Length{vg.Points(9), vg.Points(3), vg.Points(2), vg.Points(3)}}
	return l, nil
}

// cdf returns up to cdfPoints points of the empirical CDF of vals (>0).
func cdf(vals []float64) plotter.XYs {
	s := make([]float64, 0, len(vals))
	for _, v := range vals {
		if v > 0 && !math.IsInf(v, 0) {
			s = append(s, v)
		}
	}
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return nil
	}
	pts := plotter.XYs{{X: s[0], Y: 0}}
	if n <= cdfPoints {
		for i, v := range s {
			pts = append(pts, plotter.XY{X: v, Y: float64(i+1) / float64(n)})
		}
		return pts
	}
	for k := range cdfPoints {
		i := int(math.Round(float64(k) * float64(n-1) / float64(cdfPoints-1)))
		pts = append(pts, plotter.XY{X: s[i], Y: float64(i+1) / float64(n)})
	}
	return pts
}

func (cs *chartSet) ttftCDF() (*plot.Plot, *plot.Legend, bool) {
	slo := durationMs(sloOf(cs.in.Setup.SLO).TTFTP99)
	p := newPlot("TTFT distribution per "+cs.words.short()+" (all seeds pooled)",
		"time to first token, TTFT (ms, log scale)", "fraction of requests with TTFT ≤ x")
	var curves []plotter.XYs
	var names []string
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, a := range cs.aggs {
		var pooled []float64
		for _, r := range a.Runs {
			pooled = append(pooled, r.TTFTms...)
		}
		pts := cdf(pooled)
		if len(pts) == 0 {
			continue
		}
		curves = append(curves, pts)
		names = append(names, a.Policy)
		lo, hi = math.Min(lo, pts[0].X), math.Max(hi, pts[len(pts)-1].X)
	}
	if len(curves) == 0 {
		return nil, nil, false
	}
	ax := newLogAxis(math.Min(lo, slo), math.Max(hi, slo))
	leg := newLegend(len(curves) + 1)
	addGrid(p, true)
	ref, err := refLine(plotter.XYs{{X: ax.Of(slo), Y: 0}, {X: ax.Of(slo), Y: 1}}, refColor())
	if err == nil {
		p.Add(ref) // under the curves
	}
	for i, pts := range curves {
		for j := range pts {
			pts[j].X = ax.Of(pts[j].X)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			continue
		}
		l.LineStyle = lineStyle(cs.styles.of(names[i]))
		p.Add(l)
		leg.Add(names[i], l)
	}
	ax.apply(&p.X)
	p.Y.Min, p.Y.Max = 0, 1
	p.Y.Tick.Marker = fracTicks{}
	if err == nil {
		leg.Add("TTFT SLO ("+fmtMs(slo)+" ms)", ref)
	}
	return p, leg, true
}

// ttftBarsLog reports whether the TTFT bars need a log axis: the largest
// value over the smallest positive one exceeds 50.
func ttftBarsLog(aggs []policyAgg) bool {
	lo, hi := ttftBarsRange(aggs)
	return lo > 0 && hi/lo > 50
}

// ttftBarsRange is the smallest positive and the largest value of the TTFT
// bars and their error bars.
func ttftBarsRange(aggs []policyAgg) (lo, hi float64) {
	lo = math.Inf(1)
	for _, a := range aggs {
		for _, v := range []float64{a.TTFTP50.Min, a.TTFTP99.Min} {
			if v > 0 {
				lo = math.Min(lo, v)
			}
		}
		hi = math.Max(hi, math.Max(a.TTFTP50.Max, a.TTFTP99.Max))
	}
	if math.IsInf(lo, 1) {
		lo = 0
	}
	return lo, hi
}

func (cs *chartSet) ttftBars() (*plot.Plot, *plot.Legend, bool) {
	if len(cs.aggs) == 0 {
		return nil, nil, false
	}
	logY := ttftBarsLog(cs.aggs)
	yLabel := "TTFT (ms)"
	if logY {
		yLabel = "TTFT (ms, log scale)"
	}
	p := newPlot("TTFT p50 and p99 per "+cs.words.short()+" (median over seeds)", cs.words.axis(), yLabel)
	lo, hi := ttftBarsRange(cs.aggs)
	ty := func(v float64) float64 { return v }
	ax := newLogAxis(lo, hi)
	b := &bars{}
	if logY {
		ty = ax.Of
		b.Base = math.Log10(ax.Lo)
	}
	for i, a := range cs.aggs {
		st := cs.styles.of(a.Policy)
		x := float64(i)
		b.Bars = append(b.Bars,
			bar{X0: x - 0.38, X1: x, Y: ty(a.TTFTP50.Med), Err: true, Lo: ty(a.TTFTP50.Min), Hi: ty(a.TTFTP50.Max), Fill: st.Light, Edge: st.Color},
			bar{X0: x, X1: x + 0.38, Y: ty(a.TTFTP99.Med), Err: true, Lo: ty(a.TTFTP99.Min), Hi: ty(a.TTFTP99.Max), Fill: st.Color, Edge: st.Color})
	}
	leg := newLegend(4)
	leg.Add("p50 (light)", swatch{Fill: gray(0xc8), Edge: gray(0x55)})
	leg.Add("p99 (dark)", swatch{Fill: gray(0x55), Edge: gray(0x55)})
	leg.Add("min–max over seeds", whisker{})
	addGrid(p, false)
	p.Add(b)
	if logY {
		ax.apply(&p.Y)
	} else {
		p.Y.Tick.Marker = niceTicks{}
		p.Y.Min, p.Y.Max = 0, math.Max(hi*1.08, 1)
	}
	slo := durationMs(sloOf(cs.in.Setup.SLO).TTFTP99)
	if y := ty(slo); y >= p.Y.Min && y <= p.Y.Max && (!logY || slo > ax.Lo) {
		if ref, err := refLine(plotter.XYs{{X: -0.5, Y: y}, {X: float64(len(cs.aggs)) - 0.5, Y: y}}, refColor()); err == nil {
			p.Add(ref)
			leg.Add("TTFT SLO ("+fmtMs(slo)+" ms)", ref)
		}
	}
	nominalX(p, policyNames(cs.aggs), plotWidth(leg))
	return p, leg, true
}

func (cs *chartSet) hitRate() (*plot.Plot, *plot.Legend, bool) {
	if len(cs.aggs) == 0 {
		return nil, nil, false
	}
	p := newPlot("Prefix-cache hit rate per "+cs.words.short()+" (median over seeds)", cs.words.axis(),
		"hit rate (share of prompt tokens, 0–1)")
	b := &bars{}
	for i, a := range cs.aggs {
		st := cs.styles.of(a.Policy)
		x := float64(i)
		b.Bars = append(b.Bars,
			bar{X0: x - 0.38, X1: x, Y: a.HitRate.Med, Fill: st.Color, Edge: st.Color},
			bar{X0: x, X1: x + 0.38, Y: a.Predicted.Med, Fill: st.Light, Edge: st.Color})
	}
	leg := newLegend(2)
	leg.Add("measured by engines (dark)", swatch{Fill: gray(0x55), Edge: gray(0x55)})
	leg.Add("predicted by router (light)", swatch{Fill: gray(0xc8), Edge: gray(0x55)})
	addGrid(p, false)
	p.Add(b)
	p.Y.Min, p.Y.Max = 0, 1
	p.Y.Tick.Marker = fracTicks{}
	nominalX(p, policyNames(cs.aggs), plotWidth(leg))
	return p, leg, true
}

// replicas draws requests (busy false) or busy fractions per replica.
func (cs *chartSet) replicas(busy bool) (*plot.Plot, *plot.Legend, bool) {
	runs, seed, common := replicaRun(cs.in, cs.aggs)
	nRep := 0
	var names []string
	for _, r := range runs {
		for i, rs := range r.Summary.PerReplica {
			if i >= len(names) {
				name := rs.Replica
				if name == "" {
					name = "r" + strconv.Itoa(i)
				}
				names = append(names, name)
			}
		}
		nRep = max(nRep, len(r.Summary.PerReplica))
	}
	if nRep == 0 {
		return nil, nil, false
	}
	which := "first seed of each " + cs.words.short()
	if common {
		which = "seed " + strconv.FormatUint(seed, 10)
	}
	var p *plot.Plot
	if busy {
		p = newPlot("Engine busy fraction per replica ("+which+")", "replica", "busy fraction (share of simulated time, 0–1)")
	} else {
		p = newPlot("Requests per replica ("+which+")", "replica", "measured requests dispatched (count)")
	}
	const groupW = 0.84
	w := groupW / float64(len(runs))
	b := &bars{}
	leg := newLegend(len(runs) + 1)
	var total, maxV float64
	for k, r := range runs {
		st := cs.styles.of(cs.aggs[k].Policy)
		leg.Add(cs.aggs[k].Policy, swatch{Fill: st.Color, Edge: st.Color})
		for i, rs := range r.Summary.PerReplica {
			v := float64(rs.Requests)
			if busy {
				v = rs.BusyFraction
			}
			total += float64(rs.Requests)
			maxV = math.Max(maxV, v)
			x0 := float64(i) - groupW/2 + float64(k)*w
			b.Bars = append(b.Bars, bar{X0: x0, X1: x0 + w, Y: v, Fill: st.Color})
		}
	}
	addGrid(p, false)
	p.Add(b)
	if busy {
		p.Y.Min, p.Y.Max = 0, 1
		p.Y.Tick.Marker = fracTicks{}
	} else {
		p.Y.Tick.Marker = niceTicks{}
		even := total / float64(len(runs)*nRep)
		p.Y.Min, p.Y.Max = 0, math.Max(math.Max(maxV, even)*1.08, 1)
		if ref, err := refLine(plotter.XYs{{X: -0.5, Y: even}, {X: float64(nRep) - 0.5, Y: even}}, refColor()); err == nil {
			p.Add(ref)
			leg.Add("even split", ref)
		}
	}
	nominalX(p, names, plotWidth(leg))
	return p, leg, true
}

// sweep draws TTFT p99 (goodput false) or goodput against offered load.
func (cs *chartSet) sweep(goodput bool) (*plot.Plot, *plot.Legend, bool) {
	t := aggregateSweep(cs.in.Sweep, policyOrder(cs.in.Runs, cs.in.Sweep))
	if len(t.Rates) < 2 || len(t.Policies) == 0 {
		return nil, nil, false
	}
	var p *plot.Plot
	if goodput {
		p = newPlot("Goodput vs offered load (median over seeds)", "offered load (req/s)", "goodput (req/s meeting the SLO)")
	} else {
		p = newPlot("TTFT p99 vs offered load (median over seeds)", "offered load (req/s)", "TTFT p99 (ms, log scale)")
	}
	leg := newLegend(len(t.Policies) + 1)
	addGrid(p, true)
	slo := durationMs(sloOf(cs.in.Setup.SLO).TTFTP99)
	lo, hi := slo, slo
	if goodput {
		lo, hi = 0, 0
	}
	for i := range t.Policies {
		for _, c := range t.Cells[i] {
			if c == nil {
				continue
			}
			if goodput {
				hi = math.Max(hi, c.Goodput.Med)
			} else if c.TTFTP99.Med > 0 {
				lo, hi = math.Min(lo, c.TTFTP99.Med), math.Max(hi, c.TTFTP99.Med)
			}
		}
	}
	ax := newLogAxis(lo, hi)
	r0, r1 := t.Rates[0], t.Rates[len(t.Rates)-1]
	pad := (r1 - r0) * 0.04
	// The reference line goes under the data, its legend entry last.
	refXYs, refName := plotter.XYs{{X: r0 - pad, Y: ax.Of(slo)}, {X: r1 + pad, Y: ax.Of(slo)}}, "TTFT SLO ("+fmtMs(slo)+" ms)"
	if goodput {
		refXYs, refName = plotter.XYs{{X: r0, Y: r0}, {X: r1, Y: r1}}, "offered load (y = x)"
	}
	ref, refErr := refLine(refXYs, refColor())
	if refErr == nil {
		p.Add(ref)
	}
	for i, pol := range t.Policies {
		var xys plotter.XYs
		for j, c := range t.Cells[i] {
			if c == nil {
				continue
			}
			y := c.Goodput.Med
			if !goodput {
				if c.TTFTP99.Med <= 0 {
					continue // not drawable on a log axis
				}
				y = ax.Of(c.TTFTP99.Med)
			}
			xys = append(xys, plotter.XY{X: t.Rates[j], Y: y})
		}
		if len(xys) == 0 {
			continue
		}
		l, s, err := plotter.NewLinePoints(xys)
		if err != nil {
			continue
		}
		st := cs.styles.of(pol)
		l.LineStyle = lineStyle(st)
		s.GlyphStyle = draw.GlyphStyle{Color: st.Color, Radius: vg.Points(3), Shape: st.Glyph}
		p.Add(l, s)
		leg.Add(pol, l, s)
	}
	if refErr == nil {
		leg.Add(refName, ref)
	}
	p.X.Min, p.X.Max = r0-pad, r1+pad
	p.X.Tick.Marker = niceTicks{}
	if len(t.Rates) <= 12 { // label the swept rates themselves
		ticks := make([]plot.Tick, len(t.Rates))
		for j, r := range t.Rates {
			ticks[j] = plot.Tick{Value: r, Label: group(strconv.FormatFloat(r, 'f', -1, 64))}
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	if goodput {
		p.Y.Tick.Marker = niceTicks{}
		p.Y.Min, p.Y.Max = 0, math.Max(r1, hi)*1.05
	} else {
		ax.apply(&p.Y)
	}
	return p, leg, true
}

func (cs *chartSet) capacity() (*plot.Plot, *plot.Legend, bool) {
	c := cs.in.Capacity
	if c == nil || len(c.Rows) == 0 {
		return nil, nil, false
	}
	p := newPlot("Replicas needed to meet the SLO at "+fmtRate(c.RateRPS)+" req/s", cs.words.axis(),
		"replicas needed (GPUs)")
	b := &bars{LabelStyle: p.X.Tick.Label}
	b.LabelStyle.XAlign = draw.XCenter
	b.LabelStyle.YAlign = draw.YBottom
	b.LabelStyle.Rotation = 0
	never := false
	names := make([]string, len(c.Rows))
	for i, r := range c.Rows {
		names[i] = r.Policy
		st := cs.styles.of(r.Policy)
		x := float64(i)
		if r.Replicas > 0 {
			b.Bars = append(b.Bars, bar{X0: x - 0.35, X1: x + 0.35, Y: float64(r.Replicas), Fill: st.Color, Edge: st.Color,
				Label: strconv.Itoa(r.Replicas)})
			continue
		}
		never = true
		b.Bars = append(b.Bars, bar{X0: x - 0.35, X1: x + 0.35, Y: float64(c.MaxReplicas + 1), Edge: st.Color, Hatch: true,
			Label: "> " + strconv.Itoa(c.MaxReplicas)})
	}
	leg := newLegend(3)
	entries := 0
	if never {
		entries++
		leg.Add("SLO not met with ≤ "+strconv.Itoa(c.MaxReplicas)+" replicas", swatch{Edge: gray(0x40), Hatch: true})
	}
	addGrid(p, false)
	p.Add(b)
	top := float64(c.MaxReplicas + 1)
	for _, r := range c.Rows {
		top = math.Max(top, float64(r.Replicas))
	}
	p.Y.Min, p.Y.Max = 0, top*1.12+0.5
	p.Y.Tick.Marker = intTicks{}
	if base := c.row(c.BaselinePolicy()); base != nil && base.Replicas > 0 {
		y := float64(base.Replicas)
		if ref, err := refLine(plotter.XYs{{X: -0.5, Y: y}, {X: float64(len(c.Rows)) - 0.5, Y: y}}, refColor()); err == nil {
			p.Add(ref)
			leg.Add("baseline ("+base.Policy+"): "+plural(base.Replicas, "replica", "replicas"), ref)
			entries++
		}
	}
	var legend *plot.Legend
	if entries > 0 {
		legend = leg
	}
	nominalX(p, names, plotWidth(legend))
	return p, legend, true
}
