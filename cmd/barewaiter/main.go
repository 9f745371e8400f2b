// Command barewaiter is the floor the load tool measures Nodeward's held
// long-polls against (BENCHMARKS.md, issue 13): a plain net/http server
// that holds GET /agent/v1/commands?wait=SECONDS until the wait ends or the
// client leaves, and answers an empty command list. It does nothing a
// control plane must do (no auth, no database, no wake-ups), so the memory
// and CPU it spends per held poll is what Go's HTTP stack alone costs on
// this machine, measured in the same run as the real server.
//
//	barewaiter -listen 127.0.0.1:0 [-tls-cert FILE -tls-key FILE]
//
// It prints one line, "listening URL", once it accepts connections;
// GET /held answers how many polls it holds now.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	certFile := flag.String("tls-cert", "", "serve HTTPS with this certificate (PEM)")
	keyFile := flag.String("tls-key", "", "the certificate's key (PEM)")
	flag.Parse()
	if err := run(*listen, *certFile, *keyFile); err != nil {
		fmt.Fprintln(os.Stderr, "barewaiter:", err)
		os.Exit(1)
	}
}

func run(listen, certFile, keyFile string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var held atomic.Int64
	mux := http.NewServeMux()
	empty := []byte(`{"commands":[]}`)
	mux.HandleFunc("GET /agent/v1/commands", func(w http.ResponseWriter, r *http.Request) {
		wait, err := strconv.Atoi(r.URL.Query().Get("wait"))
		if err != nil || wait < 0 || wait > 60 {
			wait = 25
		}
		held.Add(1)
		t := time.NewTimer(time.Duration(wait) * time.Second)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		held.Add(-1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(empty)
	})
	mux.HandleFunc("GET /held", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, held.Load())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if certFile != "" {
		fmt.Printf("listening https://%s\n", ln.Addr())
		return srv.ServeTLS(ln, certFile, keyFile)
	}
	fmt.Printf("listening http://%s\n", ln.Addr())
	return srv.Serve(ln)
}
