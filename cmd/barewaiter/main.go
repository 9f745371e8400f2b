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
//
// With -deliver it is the floor of the deliver scenario instead
// (deliver.go): the same exchanges a command costs — invite, enroll,
// submit, the held poll's answer, the result — over plain net/http and
// encoding/json with the commands in memory, so what the machine's HTTP
// alone can deliver is measured beside the server in the same sitting.
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
	deliver := flag.Bool("deliver", false, "serve the deliver scenario's floor (commands in memory) instead of empty polls")
	flag.Parse()
	if err := run(*listen, *certFile, *keyFile, *deliver); err != nil {
		fmt.Fprintln(os.Stderr, "barewaiter:", err)
		os.Exit(1)
	}
}

func run(listen, certFile, keyFile string, deliver bool) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	scheme := "http"
	if certFile != "" {
		scheme = "https"
	}
	url := scheme + "://" + ln.Addr().String()
	mux := http.NewServeMux()
	if deliver {
		newFloor(url).routes(mux)
	} else {
		waiterRoutes(mux)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening %s\n", url)
	if certFile != "" {
		return srv.ServeTLS(ln, certFile, keyFile)
	}
	return srv.Serve(ln)
}

// waiterRoutes holds every poll for its wait and answers it empty.
func waiterRoutes(mux *http.ServeMux) {
	var held atomic.Int64
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
}
