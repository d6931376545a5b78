package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart geometry: 8x5 inches at 120 dots per inch (960x600 pixels).
const (
	chartW   = 8 * vg.Inch
	chartH   = 5 * vg.Inch
	chartDPI = 120
	margin   = vg.Length(8) // points around the plot and the legend
)

// paletteColor is the color of the i-th policy: the ten Tableau colors, then
// indigo and black; beyond twelve the colors repeat with another dash.
func paletteColor(i int) color.RGBA {
	p := [...]color.RGBA{
		{0x1f, 0x77, 0xb4, 0xff}, // blue
		{0xff, 0x7f, 0x0e, 0xff}, // orange
		{0x2c, 0xa0, 0x2c, 0xff}, // green
		{0xd6, 0x27, 0x28, 0xff}, // red
		{0x94, 0x67, 0xbd, 0xff}, // purple
		{0x8c, 0x56, 0x4b, 0xff}, // brown
		{0xe3, 0x77, 0xc2, 0xff}, // pink
		{0x7f, 0x7f, 0x7f, 0xff}, // gray
		{0xbc, 0xbd, 0x22, 0xff}, // olive
		{0x17, 0xbe, 0xcf, 0xff}, // cyan
		{0x39, 0x3b, 0x79, 0xff}, // indigo
		{0x00, 0x00, 0x00, 0xff}, // black
	}
	return p[i%len(p)]
}

// policyStyle is how one policy is drawn in every chart.
type policyStyle struct {
	Color  color.RGBA
	Light  color.RGBA // for secondary bars (p50, predicted)
	Dashes []vg.Length
	Glyph  draw.GlyphDrawer
}

// styleFor is the style of the i-th policy of the report. The first six
// colors draw solid lines, the next six dashed ones, so that lines stay
// distinguishable with twelve policies.
func styleFor(i int) policyStyle {
	c := paletteColor(i)
	s := policyStyle{Color: c, Light: tint(c, 0.55)}
	switch (i / 6) % 3 {
	case 1:
		s.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	case 2:
		s.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	}
	switch i % 6 {
	case 0:
		s.Glyph = draw.CircleGlyph{}
	case 1:
		s.Glyph = draw.SquareGlyph{}
	case 2:
		s.Glyph = draw.TriangleGlyph{}
	case 3:
		s.Glyph = draw.RingGlyph{}
	case 4:
		s.Glyph = draw.BoxGlyph{}
	default:
		s.Glyph = draw.PyramidGlyph{}
	}
	return s
}

// styles maps each policy to its style by its index in policies.
type styles struct {
	policies []string
}

func (s styles) of(policy string) policyStyle {
	for i, p := range s.policies {
		if p == policy {
			return styleFor(i)
		}
	}
	return styleFor(len(s.policies))
}

// tint mixes c with white; f=0 keeps c, f=1 gives white.
func tint(c color.RGBA, f float64) color.RGBA {
	mix := func(v uint8) uint8 { return uint8(math.Round(float64(v) + (255-float64(v))*f)) }
	return color.RGBA{mix(c.R), mix(c.G), mix(c.B), 0xff}
}

// Neutral colors for legend keys and reference lines.
func gray(v uint8) color.RGBA { return color.RGBA{v, v, v, 0xff} }

// newPlot returns a plot with the report's fonts, a title and axis labels.
func newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.Title.Padding = vg.Points(10)
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.X.Label.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.TextStyle.Font.Size = vg.Points(12)
	p.X.Tick.Label.Font.Size = vg.Points(10)
	p.Y.Tick.Label.Font.Size = vg.Points(10)
	p.X.Label.Padding = vg.Points(4)
	p.Y.Label.Padding = vg.Points(4)
	return p
}

// newLegend returns a legend drawn beside the plot, top left aligned.
func newLegend(entries int) *plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	size := vg.Points(10)
	if entries > 10 {
		size = vg.Points(9)
	}
	l.TextStyle.Font.Size = size
	l.Padding = vg.Points(2)
	l.ThumbnailWidth = vg.Points(22)
	return &l
}

// addGrid adds light grid lines at the major ticks.
func addGrid(p *plot.Plot, vertical bool) {
	g := plotter.NewGrid()
	g.Horizontal.Color = gray(0xdd)
	g.Horizontal.Width = vg.Points(0.5)
	if vertical {
		g.Vertical.Color = gray(0xdd)
		g.Vertical.Width = vg.Points(0.5)
	} else {
		g.Vertical.Color = nil
	}
	p.Add(g)
}

// render draws p, with leg (if any) in a column to its right, into a PNG.
func render(p *plot.Plot, leg *plot.Legend) ([]byte, error) {
	c := vgimg.NewWith(vgimg.UseWH(chartW, chartH), vgimg.UseDPI(chartDPI))
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	area := draw.Crop(dc, margin, -margin, margin, -margin)
	if leg != nil {
		r := leg.Rectangle(area)
		w := r.Max.X - r.Min.X + 2*margin
		top := margin
		if p.Title.Text != "" {
			top += p.Title.TextStyle.Height(p.Title.Text) + p.Title.Padding
		}
		leg.Draw(draw.Crop(area, area.Max.X-area.Min.X-w+2*margin, 0, 0, -top))
		area = draw.Crop(area, 0, -w, 0, 0)
	}
	p.Draw(area)
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("encode png: %w", err)
	}
	return buf.Bytes(), nil
}

// bar is one rectangle of a bars plotter, in data coordinates.
type bar struct {
	X0, X1 float64
	Y      float64
	Err    bool    // draw an error bar from Lo to Hi
	Lo, Hi float64 // error bar extent
	Fill   color.Color
	Edge   color.Color
	Hatch  bool
	Label  string // drawn above the bar
}

// bars draws rectangles from Base to each bar's Y, clamped to the axis
// range (so it works on log axes), with optional error bars, hatching and
// labels.
type bars struct {
	Bars       []bar
	Base       float64
	LabelStyle text.Style
}

// Plot implements plot.Plotter.
func (b *bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	clamp := func(v float64) float64 { return math.Min(math.Max(v, p.Y.Min), p.Y.Max) }
	for _, br := range b.Bars {
		x0, x1 := trX(br.X0), trX(br.X1)
		y0, y1 := trY(clamp(b.Base)), trY(clamp(br.Y))
		pts := []vg.Point{{X: x0, Y: y0}, {X: x0, Y: y1}, {X: x1, Y: y1}, {X: x1, Y: y0}}
		if br.Fill != nil {
			c.FillPolygon(br.Fill, pts)
		}
		if br.Hatch {
			hatch(c, x0, min(y0, y1), x1, max(y0, y1), br.Edge)
		}
		if br.Edge != nil {
			c.StrokeLines(draw.LineStyle{Color: br.Edge, Width: vg.Points(0.75)}, append(pts, pts[0]))
		}
		labelY := y1
		if br.Err {
			xm := (x0 + x1) / 2
			lo, hi := trY(clamp(br.Lo)), trY(clamp(br.Hi))
			capW := min((x1-x0)/4, vg.Points(4))
			sty := draw.LineStyle{Color: color.Black, Width: vg.Points(1)}
			c.StrokeLine2(sty, xm, lo, xm, hi)
			c.StrokeLine2(sty, xm-capW, lo, xm+capW, lo)
			c.StrokeLine2(sty, xm-capW, hi, xm+capW, hi)
			labelY = max(labelY, hi)
		}
		if br.Label != "" {
			c.FillText(b.LabelStyle, vg.Point{X: (x0 + x1) / 2, Y: labelY + vg.Points(3)}, br.Label)
		}
	}
}

// DataRange implements plot.DataRanger.
func (b *bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = math.Inf(1), math.Inf(-1)
	ymin, ymax = b.Base, b.Base
	for _, br := range b.Bars {
		xmin, xmax = math.Min(xmin, br.X0), math.Max(xmax, br.X1)
		ymin, ymax = math.Min(ymin, br.Y), math.Max(ymax, br.Y)
		if br.Err {
			ymax = math.Max(ymax, br.Hi)
		}
	}
	return xmin, xmax, ymin, ymax
}

// hatch fills a rectangle, in canvas coordinates, with 45° lines.
func hatch(c draw.Canvas, x0, y0, x1, y1 vg.Length, clr color.Color) {
	if clr == nil {
		clr = color.Black
	}
	sty := draw.LineStyle{Color: clr, Width: vg.Points(0.75)}
	w, h := x1-x0, y1-y0
	step := vg.Points(5)
	for k := -h; k < w; k += step {
		sx, sy := x0+k, y0
		ex, ey := x0+k+h, y1
		if sx < x0 {
			sy += x0 - sx
			sx = x0
		}
		if ex > x1 {
			ey -= ex - x1
			ex = x1
		}
		if sx >= ex {
			continue
		}
		c.StrokeLine2(sty, sx, sy, ex, ey)
	}
}

// swatch is a legend key for bars.
type swatch struct {
	Fill, Edge color.Color
	Hatch      bool
}

// Thumbnail implements plot.Thumbnailer.
func (s swatch) Thumbnail(c *draw.Canvas) {
	r := c.Rectangle
	pts := []vg.Point{r.Min, {X: r.Min.X, Y: r.Max.Y}, r.Max, {X: r.Max.X, Y: r.Min.Y}}
	if s.Fill != nil {
		c.FillPolygon(s.Fill, pts)
	}
	if s.Hatch {
		hatch(*c, r.Min.X, r.Min.Y, r.Max.X, r.Max.Y, s.Edge)
	}
	if s.Edge != nil {
		c.StrokeLines(draw.LineStyle{Color: s.Edge, Width: vg.Points(0.75)}, append(pts, pts[0]))
	}
}

// whisker is a legend key for error bars.
type whisker struct{}

// Thumbnail implements plot.Thumbnailer.
func (whisker) Thumbnail(c *draw.Canvas) {
	sty := draw.LineStyle{Color: color.Black, Width: vg.Points(1)}
	xm := (c.Min.X + c.Max.X) / 2
	capW := vg.Points(3)
	c.StrokeLine2(sty, xm, c.Min.Y, xm, c.Max.Y)
	c.StrokeLine2(sty, xm-capW, c.Min.Y, xm+capW, c.Min.Y)
	c.StrokeLine2(sty, xm-capW, c.Max.Y, xm+capW, c.Max.Y)
}

// tickLabel formats a tick value with thousands separators.
func tickLabel(v float64) string {
	if v != 0 && math.Abs(v) < 1 {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return group(strconv.FormatFloat(v, 'f', -1, 64))
}

// log10Ticks marks a linear axis over log10 values as a log axis: every
// power of ten with a label and 2..9 times it with minor ticks; over two
// decades or fewer, 2x and 5x are labelled too. (Log axes are drawn this way
// rather than with plot.LogScale, whose axis label placement pads the plot
// as if the scale were linear.)
type log10Ticks struct{}

// Ticks implements plot.Ticker.
func (log10Ticks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return nil
	}
	e0, e1 := int(math.Floor(lo)), int(math.Ceil(hi))
	dense := e1-e0 <= 2
	var ticks []plot.Tick
	for e := e0; e <= e1; e++ {
		base := math.Pow10(e)
		for m := 1; m <= 9; m++ {
			v := math.Log10(base * float64(m))
			if v < lo-1e-9 || v > hi+1e-9 {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || (dense && (m == 2 || m == 5)) {
				t.Label = tickLabel(base * float64(m))
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// niceTicks label about six round values (1, 2, 2.5 or 5 times a power of
// ten apart) with thousands separators, with a minor tick between each.
type niceTicks struct{}

// Ticks implements plot.Ticker.
func (niceTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return nil
	}
	raw := (hi - lo) / 6
	mag := math.Pow10(int(math.Floor(math.Log10(raw))))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	prec := 0
	if step < 1 {
		prec = int(math.Ceil(-math.Log10(step)))
		if step*math.Pow10(prec) != math.Round(step*math.Pow10(prec)) {
			prec++
		}
	}
	var ticks []plot.Tick
	for k := math.Ceil(lo/step*2 - 1e-9); k/2*step <= hi+1e-9*step; k++ {
		v := k / 2 * step
		t := plot.Tick{Value: v}
		if int64(k)%2 == 0 {
			if v == 0 {
				v = 0 // no "-0"
			}
			t.Label = group(strconv.FormatFloat(v, 'f', prec, 64))
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// fracTicks mark a 0..1 axis every 0.1, labelled every 0.2.
type fracTicks struct{}

// Ticks implements plot.Ticker.
func (fracTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for i := 0; i <= 10; i++ {
		v := float64(i) / 10
		if v < lo-1e-9 || v > hi+1e-9 {
			continue
		}
		t := plot.Tick{Value: v}
		if i%2 == 0 {
			t.Label = strconv.FormatFloat(v, 'f', 1, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// intTicks labels integers, every one up to 12, else about ten of them.
type intTicks struct{}

// Ticks implements plot.Ticker.
func (intTicks) Ticks(lo, hi float64) []plot.Tick {
	first, last := int(math.Ceil(lo)), int(math.Floor(hi))
	step := 1
	if last-first > 12 {
		step = int(math.Ceil(float64(last-first) / 10))
	}
	var ticks []plot.Tick
	for v := first; v <= last; v++ {
		t := plot.Tick{Value: float64(v)}
		if (v-first)%step == 0 {
			t.Label = strconv.Itoa(v)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// logRange widens [lo, hi] to whole decades for a log axis.
func logRange(lo, hi float64) (float64, float64) {
	if !(lo > 0) {
		lo = 1
	}
	if !(hi > lo) {
		hi = lo * 10
	}
	a := math.Pow10(int(math.Floor(math.Log10(lo))))
	b := math.Pow10(int(math.Ceil(math.Log10(hi))))
	if b <= a {
		b = a * 10
	}
	return a, b
}

// logAxis is a log scale drawn on a linear axis over log10 values: data
// go through Of before they are added to the plot.
type logAxis struct {
	Lo, Hi float64 // whole decades, in data units
}

// newLogAxis covers [lo, hi] with whole decades.
func newLogAxis(lo, hi float64) logAxis {
	a, b := logRange(lo, hi)
	return logAxis{Lo: a, Hi: b}
}

// Of maps a data value onto the axis; values below the axis (zero
// included) map to its bottom.
func (l logAxis) Of(v float64) float64 {
	if !(v > l.Lo) {
		return math.Log10(l.Lo)
	}
	return math.Log10(v)
}

// apply sets ax's range and ticks.
func (l logAxis) apply(ax *plot.Axis) {
	ax.Min, ax.Max = math.Log10(l.Lo), math.Log10(l.Hi)
	ax.Tick.Marker = log10Ticks{}
}

// nominalX labels integer x positions with names, rotating the labels
// when they would not fit side by side in plotWidth.
func nominalX(p *plot.Plot, names []string, plotWidth vg.Length) {
	ticks := make([]plot.Tick, len(names))
	var widest vg.Length
	for i, n := range names {
		ticks[i] = plot.Tick{Value: float64(i), Label: n}
		widest = max(widest, p.X.Tick.Label.Width(n))
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	if len(names) > 0 && widest > 0.9*plotWidth/vg.Length(len(names)) {
		p.X.Tick.Label.Rotation = math.Pi / 6
		p.X.Tick.Label.XAlign = draw.XRight
		p.X.Tick.Label.YAlign = draw.YTop
	}
}
