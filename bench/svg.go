package main

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// chart is a throughput bar chart: panels side by side, each with its own scale.
type chart struct {
	title  string
	panels []panel
}

// panel is a group of bar clusters sharing one y axis.
type panel struct {
	title  string
	unit   string   // of the y axis, e.g. "ops/s"
	legend []string // one name per bar of a cluster
	groups []group
	lines  []refLine // horizontal reference lines, e.g. the ceiling
}

// group is one cluster of bars; values follow the panel's legend (NaN: not measured).
type group struct {
	label  string
	values []float64
}

// refLine is a dashed horizontal line across a panel.
type refLine struct {
	label string
	value float64
}

// chart builds the throughput chart from the medians: scenario b's variants per
// concurrency with the ceilings as lines, and scenario d's variants.
func (b *bench) chart() chart {
	c := chart{title: fmt.Sprintf("dedupkit bench %s: median throughput of %s", b.id, plural(b.cfg.rounds, "round"))}
	if b.srv.redisEmbedded || b.srv.natsEmbedded {
		c.title += " (EMBEDDED SERVERS: MEANINGLESS FOR THROUGHPUT)"
	}
	med := func(id string) float64 {
		if s := b.res.byID[id]; s != nil {
			if v, ok := s.Median[mOps]; ok {
				return v
			}
		}
		return math.NaN()
	}
	store := panel{title: "Redis, unique keys", unit: "checks/s", legend: storeVariants}
	for _, conc := range b.cfg.concurrency {
		g := group{label: fmt.Sprintf("c=%d", conc)}
		for _, v := range store.legend {
			g.values = append(g.values, med(seriesID("store", v, conc)))
		}
		store.groups = append(store.groups, g)
	}
	for _, id := range []string{ceilingRedisBenchmark, ceilingGo} {
		if v := med(id); positive(v) {
			store.lines = append(store.lines, refLine{strings.TrimPrefix(id, "ceiling/"), v})
		}
	}
	if b.cfg.only["b"] {
		c.panels = append(c.panels, store)
	}
	if b.cfg.only["d"] {
		js := panel{title: fmt.Sprintf("JetStream, %d messages", b.cfg.jsMessages), unit: "msgs/s", legend: jsVariants}
		g := group{label: "consume + ack"}
		for _, v := range jsVariants {
			g.values = append(g.values, med(seriesID("jetstream", v, 0)))
		}
		js.groups = []group{g}
		c.panels = append(c.panels, js)
	}
	return c
}

// Geometry of a panel, in SVG user units.
const (
	panelW, panelH        = 560, 400
	plotL, plotR          = 80, 20 // margins inside a panel
	plotT, plotB          = 50, 90
	titleH                = 36
	legendRow             = 16
	barGap, clusterGap    = 2, 18
	svgFont               = "font-family=\"sans-serif\""
	axisColour, refColour = "#444", "#c00"
)

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"}

// variantColours keep a variant's colour the same in every panel.
var variantColours = map[string]string{
	varFilter: "#1f77b4", varDo: "#ff7f0e", varNaive: "#2ca02c", jsVariants[0]: "#7f7f7f",
	varRueidis: "#e377c2", varRueidis2: "#17becf",
	varGoAuto: "#bcbd22", varFilterGoAP: "#9467bd", varDoGoAP: "#8c564b", varFilterNoLocal: "#aec7e8",
}

func colour(name string, i int) string {
	if c, ok := variantColours[name]; ok {
		return c
	}
	return palette[i%len(palette)]
}

// writeSVG draws c as a standalone SVG document.
func writeSVG(w io.Writer, c chart) error {
	bw := bufio.NewWriter(w)
	n := max(len(c.panels), 1)
	width, height := n*panelW, panelH+titleH
	fmt.Fprintf(bw, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s font-size="12">`+"\n",
		width, height, width, height, svgFont)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(bw, `<text x="%d" y="22" text-anchor="middle" font-size="15">%s</text>`+"\n", width/2, esc(c.title))
	if len(c.panels) == 0 {
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">no throughput measured</text>`+"\n", width/2, height/2)
	}
	for i, p := range c.panels {
		fmt.Fprintf(bw, `<g transform="translate(%d,%d)">`+"\n", i*panelW, titleH)
		drawPanel(bw, p)
		fmt.Fprintln(bw, `</g>`)
	}
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

func drawPanel(w io.Writer, p panel) {
	plotW, plotH := float64(panelW-plotL-plotR), float64(panelH-plotT-plotB)
	top := 0.0
	for _, g := range p.groups {
		for _, v := range g.values {
			if positive(v) {
				top = math.Max(top, v)
			}
		}
	}
	for _, l := range p.lines {
		top = math.Max(top, l.value)
	}
	step := niceStep(top / 5)
	top = step * math.Ceil(top*1.05/step)
	y := func(v float64) float64 { return plotT + plotH - v/top*plotH }

	fmt.Fprintf(w, `<text x="%d" y="20" text-anchor="middle" font-size="14">%s</text>`+"\n", panelW/2, esc(p.title))
	for v := 0.0; v <= top*1.0001; v += step {
		fmt.Fprintf(w, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", plotL, plotL+plotW, y(v), y(v))
		fmt.Fprintf(w, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotL-6, y(v)+4, esc(compact(v)))
	}
	fmt.Fprintf(w, `<text transform="translate(16,%.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", plotT+plotH/2, esc(p.unit))
	fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%.1f" stroke="%s"/>`+"\n", plotL, plotL, plotT, plotT+plotH, axisColour)
	fmt.Fprintf(w, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s"/>`+"\n", plotL, plotL+plotW, plotT+plotH, plotT+plotH, axisColour)

	nb := max(len(p.legend), 1)
	clusterW := plotW / float64(max(len(p.groups), 1))
	barW := (clusterW - clusterGap - float64(nb-1)*barGap) / float64(nb)
	for gi, g := range p.groups {
		x0 := plotL + float64(gi)*clusterW + clusterGap/2
		for bi, v := range g.values {
			x := x0 + float64(bi)*(barW+barGap)
			if !positive(v) {
				fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">n/a</text>`+"\n", x+barW/2, plotT+plotH-4)
				continue
			}
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s %s</title></rect>`+"\n",
				x, y(v), barW, plotT+plotH-y(v), colour(p.legend[bi], bi), esc(g.label), esc(p.legend[bi]), esc(compact(v)), esc(p.unit))
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>`+"\n", x+barW/2, y(v)-3, esc(compact(v)))
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x0+(clusterW-clusterGap)/2, plotT+plotH+16, esc(g.label))
	}
	for _, l := range p.lines {
		fmt.Fprintf(w, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6 4"/>`+"\n", plotL, plotL+plotW, y(l.value), y(l.value), refColour)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end" fill="%s" font-size="10">%s %s</text>`+"\n", plotL+plotW, y(l.value)-3, refColour, esc(l.label), esc(compact(l.value)))
	}
	ly := plotT + plotH + 34
	for i, name := range p.legend {
		x := plotL + (i%3)*160
		yy := int(ly) + (i/3)*legendRow
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/>`+"\n", x, yy-9, colour(name, i))
		fmt.Fprintf(w, `<text x="%d" y="%d">%s</text>`+"\n", x+14, yy, esc(name))
	}
}

// niceStep returns the 1, 2 or 5 times a power of ten nearest above raw.
func niceStep(raw float64) float64 {
	if !positive(raw) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// compact writes 1234567 as "1.23M".
func compact(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.3gk", v/1e3)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
