package dispatcher

import (
	"fmt"

	"roomcast/internal/clientip"
)

// The client's address is found by internal/clientip, shared with the ChatLink.
type (
	ipSource       = clientip.Source
	trustedProxies = clientip.Prefixes
)

const (
	sourcePeer      = clientip.Peer
	sourceForwarded = clientip.Forwarded
	sourceRealIP    = clientip.RealIP
	sourceIgnored   = clientip.Ignored
	sourceInvalid   = clientip.Invalid
)

var sourceNames = clientip.SourceNames

func parseTrustedProxies(list []string) (trustedProxies, error) {
	p, err := clientip.Parse(list)
	if err != nil {
		return nil, fmt.Errorf("trusted proxy: %w", err)
	}
	return p, nil
}
