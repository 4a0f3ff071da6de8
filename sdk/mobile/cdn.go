package mobile

// CDNStats counts what a Client did on the CDN path since NewClient (docs/go-sdk.md, CDN
// mode): all zero while its room was never in CDN mode, but Late and Duplicates, which count
// the connection's messages too.
type CDNStats struct {
	// Polls is how many segment requests were made; Hits how many segments were fetched and
	// accepted; Misses how many found none (404); Failures how many failed otherwise.
	Polls, Hits, Misses, Failures int64
	// Gaps is how many windows were given up (still missing well after their end).
	Gaps int64
	// Messages is how many messages came from segments; Sampled how many the pusher's cap
	// left out of them.
	Messages, Sampled int64
	// Late is how many messages were handed on after one that sorts after them.
	Late int64
	// Duplicates is how many messages were dropped because their id had been handed on.
	Duplicates int64
}

// CDNStats returns the Client's counts on the CDN path.
func (c *Client) CDNStats() *CDNStats {
	s := c.c.CDNStats()
	return &CDNStats{
		Polls: toInt64(s.Polls), Hits: toInt64(s.Hits), Misses: toInt64(s.Misses), Failures: toInt64(s.Failures),
		Gaps: toInt64(s.Gaps), Messages: toInt64(s.Messages), Sampled: toInt64(s.Sampled),
		Late: toInt64(s.Late), Duplicates: toInt64(s.Duplicates),
	}
}
