// Package static holds the console's CSS, scripts and icons, embedded so the
// console works offline with no CDN. Scripts are small, separate files: the
// console's Content-Security-Policy allows no inline script or style.
package static

import "embed"

// Files are the console's assets, served under /static/.
//
//go:embed *.css *.js *.svg
var Files embed.FS
