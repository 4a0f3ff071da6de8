package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/proto/roomcastpb"
	"roomcast/sdk"
)

// slowReceiveBuffer is the socket receive buffer of a slow member: small, so that the
// server's backlog for it grows soon after it stops reading.
const slowReceiveBuffer = 4096

// dialSlow logs a slow member in (fanout --slow): a raw connection that sends its login and
// then never reads, like an app that froze or a client behind a stalled network. The server
// must not let it delay the room, and must handle it as a slow reader.
func dialSlow(ctx context.Context, cfg Config, hc *http.Client, room, uid string) (net.Conn, error) {
	tok, err := auth.Mint(cfg.Secret, cfg.App, uid, room, nil, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	ep, err := dispatchOne(ctx, hc, cfg.Dispatcher, cfg.App, room, uid)
	if err != nil {
		return nil, fmt.Errorf("slow member: %w", err)
	}
	login, err := proto.Marshal(&roomcastpb.Frame{Kind: &roomcastpb.Frame_Login{Login: &roomcastpb.Login{Token: tok, Device: "bench-slow"}}})
	if err != nil {
		return nil, err
	}
	addr := ep.TCPAddr
	var u *url.URL
	if cfg.Transport != sdk.TransportTCP {
		if u, err = url.Parse(ep.WSURL); err != nil {
			return nil, fmt.Errorf("slow member: %w", err)
		}
		addr = u.Host
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("slow member: %w", err)
	}
	_ = nc.(*net.TCPConn).SetReadBuffer(slowReceiveBuffer)
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if u == nil {
		_, err = nc.Write(binary.BigEndian.AppendUint32(nil, uint32(len(login))))
		if err == nil {
			_, err = nc.Write(login)
		}
	} else {
		err = wsHandshake(nc, u)
		if err == nil {
			_, err = nc.Write(maskedBinaryFrame(login))
		}
	}
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("slow member: %w", err)
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, nil
}

// wsHandshake upgrades nc, reading the answer byte by byte so that nothing after it is read.
func wsHandshake(nc net.Conn, u *url.URL) error {
	var key [16]byte
	_, _ = rand.Read(key[:])
	fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", u.RequestURI(), u.Host, base64.StdEncoding.EncodeToString(key[:]))
	br := bufio.NewReaderSize(oneByte{nc}, 16)
	status, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(status, "HTTP/1.1 101") {
		return fmt.Errorf("upgrade refused: %s", strings.TrimSpace(status))
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		if line == "\r\n" {
			return nil
		}
	}
}

// oneByte reads at most one byte at a time.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 1)]) }

// maskedBinaryFrame encodes payload as one masked client frame.
func maskedBinaryFrame(payload []byte) []byte {
	out := []byte{0x82}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n < 1<<16:
		out = append(out, 0x80|126, byte(n>>8), byte(n))
	default:
		out = binary.BigEndian.AppendUint64(append(out, 0x80|127), uint64(n))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	out = append(out, mask[:]...)
	for i, c := range payload {
		out = append(out, c^mask[i&3])
	}
	return out
}
