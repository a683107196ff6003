package bench

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"math"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/lmcache-go/lmcache/internal/atomicfile"
)

// Point is one value of a Timeline series: X seconds since the run began
// (the end of the interval), Y the series' unit.
type Point struct{ X, Y float64 }

// Timeline is the run cut into equal intervals, the data of the --report
// charts.
type Timeline struct {
	Bucket time.Duration
	// StoreGBps and RetrieveGBps are the bytes of the requests that
	// finished in each interval over the interval's length (every
	// interval, zeros included): wall-clock throughput, unlike Result's
	// per-worker busy-time figures.
	StoreGBps, RetrieveGBps []Point
	// Latency percentiles in milliseconds, only for intervals where a
	// request of that kind finished.
	LookupP50Ms, LookupP99Ms, StoreP50Ms, RetrieveP50Ms []Point
}

// NewTimeline buckets samples into intervals of bucket; bucket <= 0 picks
// about 40 intervals over the run, at least 10 ms each.
func NewTimeline(samples []Sample, bucket time.Duration) Timeline {
	var end time.Duration
	for _, s := range samples {
		end = max(end, s.At)
	}
	if bucket <= 0 {
		bucket = max(end/40, 10*time.Millisecond).Round(time.Millisecond) // a readable title
	}
	n := int(end/bucket) + 1
	type acc struct {
		bytes map[Kind]int64
		lat   map[Kind][]time.Duration
	}
	bs := make([]acc, n)
	for i := range bs {
		bs[i] = acc{bytes: map[Kind]int64{}, lat: map[Kind][]time.Duration{}}
	}
	for _, s := range samples {
		b := &bs[int(s.At/bucket)]
		b.bytes[s.Kind] += s.Bytes
		b.lat[s.Kind] = append(b.lat[s.Kind], s.Latency)
	}
	t := Timeline{Bucket: bucket}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	for i, b := range bs {
		x := (time.Duration(i+1) * bucket).Seconds()
		t.StoreGBps = append(t.StoreGBps, Point{x, float64(b.bytes[KindStore]) / bucket.Seconds() / 1e9})
		t.RetrieveGBps = append(t.RetrieveGBps, Point{x, float64(b.bytes[KindRetrieve]) / bucket.Seconds() / 1e9})
		lookups := append(b.lat[KindLookup], b.lat[KindLongLookup]...)
		if len(lookups) > 0 {
			p50, p99 := percentiles(lookups)
			t.LookupP50Ms = append(t.LookupP50Ms, Point{x, ms(p50)})
			t.LookupP99Ms = append(t.LookupP99Ms, Point{x, ms(p99)})
		}
		if l := b.lat[KindStore]; len(l) > 0 {
			p50, _ := percentiles(l)
			t.StoreP50Ms = append(t.StoreP50Ms, Point{x, ms(p50)})
		}
		if l := b.lat[KindRetrieve]; len(l) > 0 {
			p50, _ := percentiles(l)
			t.RetrieveP50Ms = append(t.RetrieveP50Ms, Point{x, ms(p50)})
		}
	}
	return t
}

func xys(ps []Point) plotter.XYs {
	out := make(plotter.XYs, len(ps))
	for i, p := range ps {
		out[i].X, out[i].Y = p.X, p.Y
	}
	return out
}

// Chart names: the legend entries of the --report charts.
const (
	SeriesStoreGBps     = "store GB/s"
	SeriesRetrieveGBps  = "retrieve GB/s"
	SeriesLookupP50     = "lookup p50 ms"
	SeriesLookupP99     = "lookup p99 ms"
	SeriesStoreP50      = "store p50 ms"
	SeriesRetrieveP50   = "retrieve p50 ms"
	chartWidth          = 24 * vg.Centimeter
	chartHeight         = 20 * vg.Centimeter
	throughputChartName = "Throughput (requests finished per %v interval)"
	latencyChartName    = "Latency per %v interval"
)

// Chart renders the timeline as an SVG: throughput over time above,
// latency over time below, drawn by gonum/plot (no network, no scripts).
func Chart(w io.Writer, t Timeline) error {
	tp := plot.New()
	tp.Title.Text = fmt.Sprintf(throughputChartName, t.Bucket)
	tp.X.Label.Text, tp.Y.Label.Text = "seconds", "GB/s"
	if err := addLines(tp, SeriesStoreGBps, t.StoreGBps, SeriesRetrieveGBps, t.RetrieveGBps); err != nil {
		return err
	}
	lp := plot.New()
	lp.Title.Text = fmt.Sprintf(latencyChartName, t.Bucket)
	lp.X.Label.Text, lp.Y.Label.Text = "seconds", "ms"
	if err := addLines(lp, SeriesLookupP50, t.LookupP50Ms, SeriesLookupP99, t.LookupP99Ms,
		SeriesStoreP50, t.StoreP50Ms, SeriesRetrieveP50, t.RetrieveP50Ms); err != nil {
		return err
	}
	// One time axis for both panels, so a latency spike lines up with the
	// throughput dip it causes.
	lp.X.Min, lp.X.Max = min(tp.X.Min, lp.X.Min), max(tp.X.Max, lp.X.Max)
	tp.X.Min, tp.X.Max = lp.X.Min, lp.X.Max
	for _, p := range []*plot.Plot{tp, lp} {
		p.Legend.Top = true
		p.Add(plotter.NewGrid())
	}
	c := vgsvg.New(chartWidth, chartHeight)
	dc := draw.New(c)
	canvases := plot.Align([][]*plot.Plot{{tp}, {lp}}, draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Centimeter}, dc)
	tp.Draw(canvases[0][0])
	lp.Draw(canvases[1][0])
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("bench: write chart: %w", err)
	}
	return nil
}

// addLines adds name/points pairs, skipping empty series (a run without a
// lookup phase has no lookup line).
func addLines(p *plot.Plot, pairs ...any) error {
	var vs []any
	for i := 0; i+1 < len(pairs); i += 2 {
		if ps := pairs[i+1].([]Point); len(ps) > 0 {
			vs = append(vs, pairs[i], xys(ps))
		}
	}
	if err := plotutil.AddLinePoints(p, vs...); err != nil {
		return fmt.Errorf("bench: chart: %w", err)
	}
	return nil
}

var reportPage = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>lmcache bench</title>
<style>body{font-family:sans-serif;margin:2em}pre{background:#f4f4f4;padding:1em}</style></head>
<body><h1>lmcache bench</h1>
<pre>{{.Summary}}</pre>
<img alt="throughput and latency over time" src="{{.Chart}}">
</body></html>
`))

// CheckReportPath validates a --report path before the run (so a typo
// does not cost a whole benchmark) and returns its format, "svg" or "html".
func CheckReportPath(path string) (string, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		return "svg", nil
	case ".html", ".htm":
		return "html", nil
	}
	return "", fmt.Errorf("bench: --report %q: want a .svg or .html file", path)
}

// WriteReport writes the --report file: an SVG chart for a .svg path, or
// an HTML page (the summary table and the chart inline, nothing fetched
// from the network) for .html/.htm. The file is written whole or not at
// all: a temporary file renamed into place.
func WriteReport(path string, o Options, r *Result) error {
	var chart bytes.Buffer
	if err := Chart(&chart, NewTimeline(r.Samples, 0)); err != nil {
		return err
	}
	format, err := CheckReportPath(path)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	switch format {
	case "svg":
		out = chart
	case "html":
		var sum strings.Builder
		Report(&sum, o, r)
		err := reportPage.Execute(&out, struct {
			Summary string
			Chart   template.URL
		}{sum.String(), template.URL("data:image/svg+xml;base64," + base64.StdEncoding.EncodeToString(chart.Bytes()))})
		if err != nil {
			return fmt.Errorf("bench: report page: %w", err)
		}
	}
	if err := atomicfile.Write(path, out.Bytes()); err != nil {
		return fmt.Errorf("bench: report: %w", err)
	}
	return nil
}

// Report writes the summary table.
func Report(w io.Writer, o Options, r *Result) {
	fmt.Fprintf(w, "layout: %d layers x %d hidden x %s, chunk %d tokens = %.1f MiB per chunk object; %d workers x %d requests of %d tokens\n\n",
		o.Layers, o.Hidden, o.Dtype, r.ChunkSize, float64(r.ChunkBytes)/(1<<20), o.Workers, o.Requests, o.PromptTokens)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\trate\tvs memcpy\tserver share\tvolume\tp50\tp99\tnotes")
	dash := "-"
	gb := func(v float64) string { return fmt.Sprintf("%.2f GB/s", v) }
	gib := func(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }
	pct := func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
	d := func(v time.Duration) string { return v.Round(time.Microsecond).String() }
	fmt.Fprintf(tw, "memcpy into shm\t%s\t%s\t%s\t%s\t%s\t%s\tbaseline: same bytes, same workers\n", gb(r.MemcpyToShmGBps), dash, dash, dash, dash, dash)
	fmt.Fprintf(tw, "memcpy out of shm\t%s\t%s\t%s\t%s\t%s\t%s\tbaseline\n", gb(r.MemcpyFromShmGBps), dash, dash, dash, dash, dash)
	fmt.Fprintf(tw, "store\t%s\t%.2f\t%s\t%s\t%s\t%s\t%d refusals while eviction caught up\n",
		gb(r.StoreGBps), ratio(r.StoreGBps, r.MemcpyToShmGBps), pct(r.StoreRPCShare), gib(r.StoredBytes), d(r.StoreP50), d(r.StoreP99), r.StoreRefusals)
	fmt.Fprintf(tw, "retrieve\t%s\t%.2f\t%s\t%s\t%s\t%s\tverified %s\n",
		gb(r.RetrieveGBps), ratio(r.RetrieveGBps, r.MemcpyFromShmGBps), pct(r.RetrieveRPCShare), gib(r.RetrievedBytes), d(r.RetrieveP50), d(r.RetrieveP99), gib(r.VerifiedBytes))
	fmt.Fprintf(tw, "lookup %d tokens\t%s\t%s\t%s\t%s\t%s\t%s\thit ratio %.3f\n", o.PromptTokens, dash, dash, dash, dash, d(r.LookupP50), d(r.LookupP99), r.HitRatio)
	if o.LookupSamples > 0 && o.LookupTokens > 0 {
		fmt.Fprintf(tw, "lookup %d tokens\t%s\t%s\t%s\t%d samples\t%s\t%s\t%d chunks hit\n", o.LookupTokens, dash, dash, dash, o.LookupSamples, d(r.LongLookupP50), d(r.LongLookupP99), r.LongLookupHitChunks)
		fmt.Fprintf(tw, "hash floor %d tokens\t%s\t%s\t%s\t%d samples\t%s\t%s\tlookup / floor: p50 %.2f, p99 %.2f\n", o.LookupTokens, dash, dash, dash, o.LookupSamples,
			d(r.LongLookupHashP50), d(r.LongLookupHashP99), ratio(float64(r.LongLookupP50), float64(r.LongLookupHashP50)), ratio(float64(r.LongLookupP99), float64(r.LongLookupHashP99)))
		fmt.Fprintf(tw, "wire floor %d tokens\t%s\t%s\t%s\t%d samples\t%s\t%s\tlookup / wire: p50 %.2f, p99 %.2f\n", o.LookupTokens, dash, dash, dash, o.LookupSamples,
			d(r.LongLookupWireP50), d(r.LongLookupWireP99), ratio(float64(r.LongLookupP50), float64(r.LongLookupWireP50)), ratio(float64(r.LongLookupP99), float64(r.LongLookupWireP99)))
		fmt.Fprintf(tw, "lookup %d, new tail\t%s\t%s\t%s\t%d samples\t%s\t%s\tlookup / floor: p50 %.2f, p99 %.2f\n", o.LookupTokens, dash, dash, dash, o.LookupSamples,
			d(r.LongLookupNewTailP50), d(r.LongLookupNewTailP99), ratio(float64(r.LongLookupNewTailP50), float64(r.LongLookupHashP50)), ratio(float64(r.LongLookupNewTailP99), float64(r.LongLookupHashP99)))
	}
	if o.PingClients > 0 && o.PingDuration > 0 {
		fmt.Fprintf(tw, "PING\t%.0f/s\t%s\t%s\t%s\t%s\t%s\t%d clients\n", r.PingPerSec, dash, dash, dash, dash, dash, o.PingClients)
	}
	_ = tw.Flush()
}

// ratio is a/b, 0 when b is 0 (a phase that measured nothing).
func ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(b) {
		return 0
	}
	return a / b
}
