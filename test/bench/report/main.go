// Command report assembles docs/benchmarks.md from the sections that the
// limiter, sidecar, operator and RLS benchmark programs wrote in the same
// `make bench` run, adds the machine description and the commands to
// reproduce, and plots the limiter's decisions/s against concurrency beside
// the textbook approach and the redis-benchmark ceiling.
//
//	go run ./test/bench/report -limiter docs/bench/limiter.md -sidecar docs/bench/sidecar.md -operator docs/bench/operator.md -rls docs/bench/rls.md -out docs/benchmarks.md
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"image/color"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

func main() {
	limiterMD := flag.String("limiter", "docs/bench/limiter.md", "limiter section (its CSV is next to it)")
	sidecarMD := flag.String("sidecar", "docs/bench/sidecar.md", "sidecar section")
	operatorMD := flag.String("operator", "docs/bench/operator.md", "operator section")
	rlsMD := flag.String("rls", "docs/bench/rls.md", "RLS server section")
	out := flag.String("out", "docs/benchmarks.md", "report to write")
	flag.Parse()

	csvPath := strings.TrimSuffix(*limiterMD, filepath.Ext(*limiterMD)) + ".csv"
	png := filepath.Join(filepath.Dir(*limiterMD), "limiter-throughput.png")
	if err := plotThroughput(csvPath, png); err != nil {
		log.Fatalf("plot: %v", err)
	}
	rel, err := filepath.Rel(filepath.Dir(*out), png)
	if err != nil {
		log.Fatal(err)
	}

	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("<!-- Written by `make bench`; do not edit by hand. -->\n\n")
	b.WriteString("Every figure below comes from one `make bench` run on one machine: the compared\n")
	b.WriteString("approaches ran side by side in that run, against the same redis-server, so the\n")
	b.WriteString("**ratios** are what to read; absolute numbers move with the machine and its load.\n\n")
	b.WriteString("## Machine\n\n")
	fmt.Fprintf(&b, "- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- CPU: %s, %d logical CPUs\n", cpuModel(), runtime.NumCPU())
	fmt.Fprintf(&b, "- Memory: %s\n", memTotal())
	fmt.Fprintf(&b, "- OS: %s/%s, %s\n", runtime.GOOS, runtime.GOARCH, osRelease())
	fmt.Fprintf(&b, "- Go: %s; Redis: %s\n\n", runtime.Version(), command("redis-server", "--version"))
	b.WriteString("## Reproduce\n\n```sh\nmake bench\n# or the parts:\n")
	b.WriteString("go run ./test/bench/limiter -out docs/bench/limiter.md\n")
	b.WriteString("go run ./test/bench/sidecar -out docs/bench/sidecar.md\n")
	b.WriteString("KUBEBUILDER_ASSETS=\"$(hack/envtest.sh)\" go run ./test/bench/operator -out docs/bench/operator.md\n")
	b.WriteString("go run ./test/bench/rls -out docs/bench/rls.md\n")
	b.WriteString("go run ./test/bench/limiter -deny-cache-only -out docs/bench/limiter.md   # its deny cache section alone\n")
	b.WriteString("go run ./test/bench/limiter -cost-only -out docs/bench/limiter.md         # its cost limits sections alone\n")
	b.WriteString("go run ./test/bench/sidecar -stream-only -out docs/bench/sidecar.md       # its streaming section alone\n")
	b.WriteString("go run ./test/bench/report\n")
	b.WriteString("go test -run XXX -bench . ./internal/limiter   # the hot-path micro-benchmarks\n```\n\n")
	for _, sec := range []string{*limiterMD, *sidecarMD, *operatorMD, *rlsMD} {
		raw, err := os.ReadFile(sec)
		if err != nil {
			log.Fatalf("%v (run the benchmark programs first)", err)
		}
		b.Write(raw)
		b.WriteString("\n")
		if sec == *limiterMD {
			fmt.Fprintf(&b, "### Decisions per second against concurrency\n\n![decisions/s against concurrent callers](%s)\n\n", rel)
		}
	}
	if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
		log.Fatal(err)
	}
}

// plotThroughput draws decisions/s against callers for the limiter, the
// textbook approach and the ceiling, one line style per algorithm.
func plotThroughput(csvPath, png string) error {
	f, err := os.Open(csvPath)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return err
	}
	if len(recs) < 2 {
		return fmt.Errorf("%s has no rows", csvPath)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	series := map[string]plotter.XYs{}
	var order []string
	for _, r := range recs[1:] {
		callers, _ := strconv.ParseFloat(r[col["callers"]], 64)
		for _, what := range []string{"limiter", "textbook", "ceiling"} {
			v, _ := strconv.ParseFloat(r[col[what+"_dps"]], 64)
			name := r[col["algorithm"]] + " " + what
			if _, ok := series[name]; !ok {
				order = append(order, name)
			}
			series[name] = append(series[name], plotter.XY{X: callers, Y: v})
		}
	}
	p := plot.New()
	p.Title.Text = "slidegate limiter: decisions/s against concurrent callers"
	p.X.Label.Text = "concurrent callers (log scale)"
	p.Y.Label.Text = "decisions per second"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = false, false // bottom right: empty below the textbook lines
	colors := map[string]color.Color{
		"limiter":  color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		"textbook": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		"ceiling":  color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	}
	for _, name := range order {
		l, pts, err := plotter.NewLinePoints(series[name])
		if err != nil {
			return err
		}
		kind := name[strings.LastIndex(name, " ")+1:]
		l.Color, pts.Color = colors[kind], colors[kind]
		if strings.HasPrefix(name, "SlidingWindowCounter") {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			pts.Shape = draw.TriangleGlyph{}
		}
		p.Add(l, pts)
		p.Legend.Add(name, l, pts)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, png)
}

func cpuModel() string {
	raw, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memTotal() string {
	raw, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return fmt.Sprintf("%.1f GiB", kb/1024/1024)
		}
	}
	return "unknown"
}

func osRelease() string {
	raw, _ := os.ReadFile("/etc/os-release")
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "unknown"
}

func command(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
