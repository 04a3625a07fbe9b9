package testbed

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// HTTPGet fetches url from inside the namespace (e.g. a proxy's
// http://127.0.0.1:10249/metrics) and returns the body of a 200 answer.
func (n Netns) HTTPGet(ctx context.Context, url string) (string, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}
