// Package static holds the console's CSS, scripts and icons, embedded so the
// console works offline with no CDN.
package static

import "embed"

// Files are the console's assets, served under /static/.
//
//go:embed *.css
var Files embed.FS
