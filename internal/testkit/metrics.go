package testkit

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
)

// MetricValue reads one series (name and labels as /metrics writes them) from the Prometheus
// endpoint at url; a series not there yet reads 0.
func MetricValue(t testing.TB, url, series string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(regexp.QuoteMeta(series) + ` (\S+)`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseFloat(string(m[1]), 64)
	return int(n)
}
