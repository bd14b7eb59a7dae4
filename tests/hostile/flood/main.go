// httpflood opens new TCP connections to an HTTP port at a fixed rate and, meanwhile, probes the port the
// way kubelet does (a fresh connection per probe, "GET <path>", one second for the whole exchange, 2xx or
// 3xx is success). It prints one JSON object: what the flood managed and how the probes fared.
//
// The flood's connections come from 127.0.0.2-127.0.0.254 (the probes' from 127.0.0.1), so a high rate does
// not run out of source ports, and each is reset (SO_LINGER 0) once held, so none lingers in TIME_WAIT.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type result struct {
	Rate            int            `json:"rate"`
	Seconds         float64        `json:"seconds"`
	Attempted       int64          `json:"attempted"`
	Connected       int64          `json:"connected"`
	ConnectFailures int64          `json:"connect_failures"`
	ClosedByServer  int64          `json:"closed_by_server"`
	Probes          int            `json:"probes"`
	ProbeOK         int            `json:"probe_ok"`
	ProbeFailures   map[string]int `json:"probe_failures"`
	// the longest run of probes that failed one after the other (kubelet restarts after failureThreshold, 3)
	ProbeFailedInARow int     `json:"probe_failed_in_a_row"`
	ProbeP50Ms        float64 `json:"probe_p50_ms"`
	ProbeP99Ms        float64 `json:"probe_p99_ms"`
	ProbeMaxMs        float64 `json:"probe_max_ms"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8087", "host:port of the HTTP port")
	rate := flag.Int("rate", 1000, "new flood connections per second (0: probes only)")
	duration := flag.Duration("duration", 5*time.Second, "how long the flood lasts")
	payload := flag.String("payload", "", "what each flood connection sends once connected")
	hold := flag.Duration("hold", time.Second, "how long a flood connection is kept before it is reset")
	path := flag.String("probe-path", "/healthz", "the probed path")
	interval := flag.Duration("probe-interval", 100*time.Millisecond, "time between two probes")
	timeout := flag.Duration("probe-timeout", time.Second, "a probe's whole time (kubelet's timeoutSeconds)")
	flag.Parse()
	raiseFileLimit()

	res := result{Rate: *rate, ProbeFailures: map[string]int{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var attempted, connected, failed, closed atomic.Int64
	started := time.Now()
	if *rate > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flood(*addr, *rate, []byte(*payload), *hold, stop, &attempted, &connected, &failed, &closed)
		}()
	}
	var latencies []float64
	failedInARow := 0
	probeTicker := time.NewTicker(*interval)
	end := time.After(*duration)
loop:
	for {
		select {
		case <-end:
			break loop
		case <-probeTicker.C:
			took, why := probe(*addr, *path, *timeout)
			res.Probes++
			if why == "" {
				res.ProbeOK++
				latencies = append(latencies, took.Seconds()*1000)
				failedInARow = 0
			} else {
				res.ProbeFailures[why]++
				failedInARow++
				res.ProbeFailedInARow = max(res.ProbeFailedInARow, failedInARow)
			}
		}
	}
	probeTicker.Stop()
	close(stop)
	wg.Wait()
	res.Seconds = time.Since(started).Seconds()
	res.Attempted, res.Connected, res.ConnectFailures, res.ClosedByServer = attempted.Load(), connected.Load(), failed.Load(), closed.Load()
	if len(latencies) > 0 {
		sort.Float64s(latencies)
		res.ProbeP50Ms = latencies[len(latencies)/2]
		res.ProbeP99Ms = latencies[len(latencies)*99/100]
		res.ProbeMaxMs = latencies[len(latencies)-1]
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

// flood starts rate/1000 connections every millisecond until stop; each sends payload, is held for hold
// (or until the server closes it) and reset.
func flood(addr string, rate int, payload []byte, hold time.Duration, stop chan struct{}, attempted, connected, failed, closed *atomic.Int64) {
	var wg sync.WaitGroup
	defer wg.Wait()
	ticker := time.NewTicker(time.Millisecond)
	defer ticker.Stop()
	started := time.Now()
	source := 0
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		due := int64(time.Since(started).Seconds()*float64(rate)) - attempted.Load()
		for ; due > 0; due-- {
			attempted.Add(1)
			source = source%253 + 2
			local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(source))}
			wg.Add(1)
			go func() {
				defer wg.Done()
				dialer := net.Dialer{LocalAddr: local, Timeout: time.Second}
				conn, err := dialer.Dial("tcp", addr)
				if err != nil {
					failed.Add(1)
					return
				}
				connected.Add(1)
				tcp := conn.(*net.TCPConn)
				defer func() { _ = tcp.SetLinger(0); _ = tcp.Close() }()
				if len(payload) > 0 {
					if _, err := tcp.Write(payload); err != nil {
						closed.Add(1)
						return
					}
				}
				_ = tcp.SetReadDeadline(time.Now().Add(hold))
				buf := make([]byte, 4096)
				for {
					if _, err := tcp.Read(buf); err != nil {
						if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
							closed.Add(1)
						}
						return
					}
				}
			}()
		}
	}
}

// probe is one kubelet HTTP probe: a fresh connection, one request, the status line within timeout.
func probe(addr, path string, timeout time.Duration) (time.Duration, string) {
	started := time.Now()
	deadline := started.Add(timeout)
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return 0, "connect timeout"
		}
		return 0, "connect refused or reset"
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kube-probe/1.36\r\nAccept: */*\r\nConnection: close\r\n\r\n", path, addr); err != nil {
		return 0, "closed before the request"
	}
	answer, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return 0, "no answer in time"
		}
		return 0, "closed without an answer"
	}
	answer.Body.Close()
	if answer.StatusCode < 200 || answer.StatusCode >= 400 {
		return 0, fmt.Sprintf("status %d", answer.StatusCode)
	}
	return time.Since(started), ""
}

func raiseFileLimit() {
	var limit syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit) == nil {
		limit.Cur = limit.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit)
	}
}
