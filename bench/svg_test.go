package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"strings"
	"testing"
)

// svgShape is what a test reads back from an SVG document.
type svgShape struct {
	root  string
	bars  int // <rect> elements with a <title>: the data bars
	texts []string
}

// parseSVG decodes doc as XML, failing the test if it is not well-formed.
func parseSVG(t *testing.T, doc []byte) svgShape {
	t.Helper()
	var s svgShape
	d := xml.NewDecoder(bytes.NewReader(doc))
	var stack []string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, doc)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if s.root == "" {
				s.root = el.Name.Space + " " + el.Name.Local
			}
			if el.Name.Local == "title" && len(stack) > 0 && stack[len(stack)-1] == "rect" {
				s.bars++
			}
			stack = append(stack, el.Name.Local)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 && stack[len(stack)-1] == "text" {
				s.texts = append(s.texts, string(el))
			}
		}
	}
	if len(stack) != 0 {
		t.Fatalf("SVG ends inside %v", stack)
	}
	if s.root != "http://www.w3.org/2000/svg svg" {
		t.Fatalf("root element %q, want svg in the SVG namespace", s.root)
	}
	return s
}

func checkSVG(t *testing.T, path string) {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s := parseSVG(t, doc); s.bars == 0 {
		t.Errorf("%s has no bars", path)
	}
}

func TestWriteSVG(t *testing.T) {
	c := chart{
		title: `throughput <"quoted"> & more`,
		panels: []panel{
			{
				title: "Redis", unit: "checks/s", legend: []string{"a<b", "c&d", "e"},
				groups: []group{
					{label: "c=1", values: []float64{1000, 2500, math.NaN()}},
					{label: "c=64", values: []float64{123456, 0, 99999}},
				},
				lines: []refLine{{label: "ceiling", value: 870000}},
			},
			{title: "JetStream", unit: "msgs/s", legend: []string{"raw"}, groups: []group{{label: "x", values: []float64{5e4}}}},
		},
	}
	var buf bytes.Buffer
	if err := writeSVG(&buf, c); err != nil {
		t.Fatal(err)
	}
	s := parseSVG(t, buf.Bytes())
	if s.bars != 5 { // 4 positive values in the first panel, 1 in the second
		t.Errorf("%d bars, want 5 (NaN and 0 are not drawn)", s.bars)
	}
	all := strings.Join(s.texts, "|")
	for _, want := range []string{`throughput <"quoted"> & more`, "a<b", "c&d", "ceiling 870k", "n/a", "123k"} {
		if !strings.Contains(all, want) {
			t.Errorf("text %q not in the chart's texts %q", want, all)
		}
	}

	buf.Reset()
	if err := writeSVG(&buf, chart{title: "empty"}); err != nil {
		t.Fatal(err)
	}
	if s := parseSVG(t, buf.Bytes()); s.bars != 0 || !strings.Contains(strings.Join(s.texts, "|"), "no throughput measured") {
		t.Errorf("empty chart: %+v", s)
	}
}

func TestNiceStepAndCompact(t *testing.T) {
	for _, c := range []struct{ raw, want float64 }{
		{0.7, 1}, {1, 1}, {1.5, 2}, {3, 5}, {7, 10}, {170_000, 200_000}, {0, 1}, {math.NaN(), 1},
	} {
		if got := niceStep(c.raw); got != c.want {
			t.Errorf("niceStep(%v) = %v, want %v", c.raw, got, c.want)
		}
	}
	for _, c := range []struct {
		v    float64
		want string
	}{{870000, "870k"}, {1_234_567, "1.23M"}, {12.5, "12.5"}, {0, "0"}} {
		if got := compact(c.v); got != c.want {
			t.Errorf("compact(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}
