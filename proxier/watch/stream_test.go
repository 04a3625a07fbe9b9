package watch

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// sizedBody records the size of every read asked of it and the close.
type sizedBody struct {
	r      io.Reader
	asked  []int
	closed bool
}

func (b *sizedBody) Read(p []byte) (int, error) {
	b.asked = append(b.asked, len(p))
	return b.r.Read(p)
}

func (b *sizedBody) Close() error { b.closed = true; return nil }

func TestBufferStreamsReadsWatchBodiesInLargeReads(t *testing.T) {
	for _, tc := range []struct {
		url      string
		buffered bool
	}{
		{"/api/v1/services?watch=true&sendInitialEvents=true", true},
		{"/api/v1/services?watch=1", true},
		{"/api/v1/services?limit=500", false},
		{"/api/v1/services?watch=false", false},
	} {
		body := &sizedBody{r: io.LimitReader(zeros{}, 3*streamBufferSize)}
		rt := BufferStreams(roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: body}, nil
		}))
		resp, err := rt.RoundTrip(httptest.NewRequest("GET", tc.url, nil))
		if err != nil {
			t.Fatal(err)
		}
		// The streaming decoder's reads: a frame's length, then its object.
		buf := make([]byte, 700)
		for {
			if _, err := io.ReadFull(resp.Body, buf[:4]); err != nil {
				break
			}
			if _, err := io.ReadFull(resp.Body, buf); err != nil {
				break
			}
		}
		if err := resp.Body.Close(); err != nil || !body.closed {
			t.Errorf("%s: Close: %v, the body closed: %v", tc.url, err, body.closed)
		}
		small := 0
		for _, n := range body.asked {
			if n < streamBufferSize {
				small++
			}
		}
		if tc.buffered && small > 0 {
			t.Errorf("%s: %d of %d reads of the body were smaller than %d bytes: %v", tc.url, small, len(body.asked), streamBufferSize, body.asked)
		}
		if !tc.buffered && (small == 0 || resp.Body != io.ReadCloser(body)) {
			t.Errorf("%s: the body of a request that is not a watch was wrapped (%d small reads)", tc.url, small)
		}
	}
}

// A buffered read returns what the stream holds without waiting for more:
// a watch event must reach the decoder as soon as it arrives.
func TestBufferStreamsHoldsNothingBack(t *testing.T) {
	pr, pw := io.Pipe()
	rt := BufferStreams(roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: pr}, nil
	}))
	resp, err := rt.RoundTrip(httptest.NewRequest("GET", "/api/v1/services?watch=true", nil))
	if err != nil {
		t.Fatal(err)
	}
	event := []byte("one event")
	go func() { _, _ = pw.Write(event) }() // and nothing more until the read returns
	got := make([]byte, 100)
	n, err := resp.Body.Read(got)
	if err != nil || string(got[:n]) != string(event) {
		t.Fatalf("Read = %q, %v; want %q at once", got[:n], err, event)
	}
	_ = pw.Close()
	_ = resp.Body.Close()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
