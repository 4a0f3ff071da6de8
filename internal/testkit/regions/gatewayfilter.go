package regions

import (
	"bytes"
	"encoding/json"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// gatewayFromToxic closes a gateway connection that a server of another region than Gateway
// dials through the proxy. Servers tell each other the addresses they reach other regions by
// (NATS's gateway gossip), and on loopback any server can dial any proxy: without this check a
// cut region's servers reconnected through the proxies of the links between the other regions
// (a proxy from eu to na takes a server of as to na just as well), and the cut went one way
// only, their outbound traffic still crossing. The dialling side's first line is its CONNECT,
// whose "gateway" field names its region; it is held until complete, then passed on or the
// connection closed.
type gatewayFromToxic struct {
	Gateway string `json:"gateway"`
}

// gatewayFromState is one connection's: what came before the CONNECT line was complete.
type gatewayFromState struct {
	checked bool
	head    []byte
}

func (t *gatewayFromToxic) NewState() any { return new(gatewayFromState) }

func (t *gatewayFromToxic) Pipe(stub *toxics.ToxicStub) {
	st := stub.State.(*gatewayFromState)
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if !st.checked {
				st.head = append(st.head, c.Data...)
				line, _, complete := bytes.Cut(st.head, []byte("\r\n"))
				if !complete && len(st.head) < 64<<10 {
					continue
				}
				st.checked = true
				if connectGateway(line) != t.Gateway {
					stub.Close()
					return
				}
				c = &stream.StreamChunk{Data: st.head, Timestamp: c.Timestamp}
				st.head = nil
			}
			stub.Output <- c
		}
	}
}

// connectGateway returns the gateway (region) named by a CONNECT line, or "".
func connectGateway(line []byte) string {
	body, ok := bytes.CutPrefix(line, []byte("CONNECT "))
	if !ok {
		return ""
	}
	var info struct {
		Gateway string `json:"gateway"`
	}
	if json.Unmarshal(body, &info) != nil {
		return ""
	}
	return info.Gateway
}

func init() { toxics.Register("gateway_from", new(gatewayFromToxic)) }
