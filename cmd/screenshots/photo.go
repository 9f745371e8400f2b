package main

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"sort"

	"github.com/chromedp/chromedp"
)

// width is one screen the pages are photographed at.
type width struct {
	name          string
	width, height int64
	mobile        bool
}

var widths = []width{
	{name: "laptop", width: 1366, height: 900},
	{name: "phone", width: 390, height: 844, mobile: true},
}

// shot is one page photographed: the file's name and how to get there.
type shot struct {
	name string
	// path is navigated to, then ready awaited (a CSS selector).
	path, ready string
	// steps, when set, replace navigating (the invite answer is a form's
	// answer).
	steps func(base string, w width) []chromedp.Action[chromedp.Void]
}

func byTestID(id string) chromedp.CSS { return chromedp.CSS(`[data-testid="` + id + `"]`) }

func shots(s seeded) []shot {
	return []shot{
		{name: "overview", path: "/console/", ready: `[data-testid="overview"]`},
		{name: "nodes", path: "/console/nodes", ready: "main h1"},
		{name: "node", path: "/console/nodes/" + s.Node, ready: `[data-testid="identity"]`},
		{name: "invite", path: "/console/nodes/invite", ready: `[data-testid="invite-form"]`},
		{name: "invite-answer", steps: func(base string, w width) []chromedp.Action[chromedp.Void] {
			return []chromedp.Action[chromedp.Void]{
				chromedp.Navigate(base + "/console/nodes/invite"),
				chromedp.WaitVisible(byTestID("invite-form")),
				chromedp.SendKeys(byTestID("invite-rental"), "rack-3-slot-"+w.name),
				chromedp.SendKeys(byTestID("invite-price"), "0.25"),
				chromedp.Click(byTestID("invite-submit")),
				chromedp.WaitVisible(byTestID("bootstrap-json")),
			}
		}},
		{name: "operations", path: "/console/operations", ready: `[data-testid="operation-table"]`},
		{name: "operation", path: "/console/operations/" + s.Parent, ready: `[data-testid="operation-summary"]`},
		{name: "operation-failed", path: "/console/operations/" + s.Failed, ready: `[data-testid="operation-summary"]`},
		{name: "secret-audit", path: "/console/secret-audit", ready: `[data-testid="secret-audit-table"]`},
		{name: "package-hosts", path: "/console/package-hosts", ready: `[data-testid="host-table"]`},
		{name: "tokens", path: "/console/tokens", ready: "main h1"},
		{name: "admins", path: "/console/admins", ready: `[data-testid="admin-table"]`},
		{name: "account", path: "/console/account", ready: `[data-testid="password-form"]`},
		{name: "audit", path: "/console/audit", ready: "main h1"},
	}
}

// photograph signs in and writes NAME-WIDTH.png for every page and width,
// the login form first.
func photograph(ctx context.Context, browserPath, profile, base, out string, maxHeight int, s seeded) error {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browserPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("font-render-hinting", "none"),
		chromedp.UserDataDir(profile),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx); err != nil {
		return fmt.Errorf("start chromium: %w", err)
	}
	// The sign-in form at each width, then signing in once (the session
	// is kept for the rest).
	for _, w := range widths {
		if err := chromedp.Do(bctx, emulate(w, w.height), chromedp.Navigate(base+"/console/login"),
			chromedp.WaitVisible(byTestID("login-form"))); err != nil {
			return err
		}
		if err := capture(bctx, w, maxHeight, filepath.Join(out, "login-"+w.name+".png")); err != nil {
			return err
		}
	}
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(byTestID("login-username"), adminUser),
		chromedp.SendKeys(byTestID("login-password"), adminPassword),
		chromedp.Click(byTestID("login-submit")),
		chromedp.WaitVisible(byTestID("overview")),
	); err != nil {
		return fmt.Errorf("sign in: %w", err)
	}
	for _, w := range widths {
		if err := chromedp.Do(bctx, emulate(w, w.height)); err != nil {
			return err
		}
		for _, sh := range shots(s) {
			steps := []chromedp.Action[chromedp.Void]{chromedp.Navigate(base + sh.path), chromedp.WaitVisible(chromedp.CSS(sh.ready))}
			if sh.steps != nil {
				steps = sh.steps(base, w)
			}
			if err := chromedp.Do(bctx, steps...); err != nil {
				return fmt.Errorf("%s at %s: %w", sh.name, w.name, err)
			}
			if err := capture(bctx, w, maxHeight, filepath.Join(out, sh.name+"-"+w.name+".png")); err != nil {
				return fmt.Errorf("%s at %s: %w", sh.name, w.name, err)
			}
		}
	}
	return nil
}

func emulate(w width, height int64) chromedp.Action[chromedp.Void] {
	if w.mobile {
		return chromedp.EmulateViewport(w.width, height, chromedp.EmulateMobile, chromedp.EmulateTouch)
	}
	return chromedp.EmulateViewport(w.width, height)
}

// capture photographs the whole page, at most maxHeight tall: the viewport
// is stretched to the page's height (so nothing sticky repeats), the
// picture taken, and the PNG re-encoded at the best compression.
func capture(ctx context.Context, w width, maxHeight int, path string) error {
	// Fonts loaded and layout settled before measuring.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`document.fonts.ready.then(() => 1)`, chromedp.EvalAwaitPromise)); err != nil {
		return err
	}
	h, err := chromedp.Run(ctx, chromedp.Evaluate[int64](`Math.ceil(document.documentElement.scrollHeight)`))
	if err != nil {
		return err
	}
	h = max(min(h, int64(maxHeight)), w.height)
	if err := chromedp.Do(ctx, emulate(w, h)); err != nil {
		return err
	}
	// Two frames: the resized layout is painted before the picture.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](
		`new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))`, chromedp.EvalAwaitPromise)); err != nil {
		return err
	}
	raw, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		return err
	}
	if err := chromedp.Do(ctx, emulate(w, w.height)); err != nil {
		return err
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, paletted(img)); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "screenshots: %s (%d KiB)\n", path, buf.Len()/1024)
	return nil
}

// paletted reduces a screenshot to its 256 most used colours, every
// other pixel drawn in the nearest of them (no dithering: the console is
// flat colours, and only the edges of text lose a shade). It keeps
// the PNGs a third of their size.
func paletted(img image.Image) *image.Paletted {
	b := img.Bounds()
	counts := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			counts[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	type entry struct {
		c color.RGBA
		n int
	}
	all := make([]entry, 0, len(counts))
	for c, n := range counts {
		all = append(all, entry{c, n})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].n != all[j].n {
			return all[i].n > all[j].n
		}
		return fmt.Sprint(all[i].c) < fmt.Sprint(all[j].c)
	})
	var pal color.Palette
	for i := 0; i < len(all) && i < 256; i++ {
		pal = append(pal, all[i].c)
	}
	out := image.NewPaletted(b, pal)
	index := map[color.RGBA]uint8{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	return out
}
