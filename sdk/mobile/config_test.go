package mobile

import (
	"strings"
	"testing"
)

type lines struct{ got []string }

func (l *lines) Log(level int, line string) {
	l.got = append(l.got, map[int]string{LogDebug: "DEBUG", LogInfo: "INFO", LogWarn: "WARN", LogError: "ERROR"}[level]+" "+line)
}

// TestLogger: the Go SDK's log records reach the app's Logger at its level and above, with
// their attributes.
func TestLogger(t *testing.T) {
	var l lines
	sc, err := Config{Logger: &l, LogLevel: LogInfo}.sdkConfig()
	if err != nil {
		t.Fatal(err)
	}
	log := sc.Logger.With("node", "cl-1").WithGroup("conn")
	log.Debug("dropped", "n", 1)
	log.Warn("roomcast: reconnecting", "attempt", 2)
	sc.Logger.Error("closed")
	want := []string{"WARN roomcast: reconnecting node=cl-1 conn.attempt=2", "ERROR closed"}
	if strings.Join(l.got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q, want %q", l.got, want)
	}
	if sc, _ := (Config{}).sdkConfig(); sc.Logger != nil {
		t.Error("a Logger without Config.Logger")
	}
}

// TestRootCAsPEM: a PEM certificate becomes the TLS roots; text without one is an error.
func TestRootCAsPEM(t *testing.T) {
	if _, err := (Config{RootCAsPEM: "not a certificate"}).sdkConfig(); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("err = %v", err)
	}
	sc, err := Config{RootCAsPEM: testCA}.sdkConfig()
	if err != nil || sc.TLS == nil || sc.TLS.RootCAs == nil {
		t.Fatalf("TLS %+v, %v: want the PEM's roots", sc.TLS, err)
	}
	if sc, _ := (Config{}).sdkConfig(); sc.TLS != nil {
		t.Error("TLS set without RootCAsPEM: the system's roots should hold")
	}
}

// testCA is a self-signed certificate (its key discarded): a private CA's root as an app would embed it.
const testCA = `-----BEGIN CERTIFICATE-----
MIIBjDCCATOgAwIBAgIUHeTl+nUM3GVs2t6ADziee4v8BOwwCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQcm9vbWNhc3QtdGVzdC1jYTAgFw0yNjEyMDQwNzQwMTJaGA8y
MTI2MTExMDA3NDAxMlowGzEZMBcGA1UEAwwQcm9vbWNhc3QtdGVzdC1jYTBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABIRE2zsTLo5MxaKbXKQwEgKrce+DlXoMKdTH
BwIHuQA9ew6fOVLNkAr4j8BiVT+c7CleuMb4jUYtWNfs6YkO1/ajUzBRMB0GA1Ud
DgQWBBQx/eEO6SPvD/QZ65jrrfCnTLxhjjAfBgNVHSMEGDAWgBQx/eEO6SPvD/QZ
65jrrfCnTLxhjjAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCIF9X
2gtqw7s08/cTB6lUJKI/eE1qWlXS1J+9iPYHrBrgAiBcQq2wkFjmZBfNpX/SOipQ
kej1PrnqLHmLz/GdhZb75Q==
-----END CERTIFICATE-----`
