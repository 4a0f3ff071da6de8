package api

import (
	"context"
	"net/http"

	"roomcast/proto/apipb"
)

// What the ops console (package console) needs of the server API: its key check and the rooms'
// CDN settings.

// Guard returns a wrapper for handlers outside the API's route list that need an API key with
// scope: it answers a missing, unknown or too narrow key as every API error (401 or 403 with an
// ErrorBody) and otherwise calls next with the app the key acts for.
func (a *API) Guard(scope string) func(next func(w http.ResponseWriter, r *http.Request, app string)) http.Handler {
	return func(next func(w http.ResponseWriter, r *http.Request, app string)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			app, err := a.authorizeScope(r.Header.Get("Authorization"), scope, r.Method+" "+r.URL.Path)
			if err != nil {
				writeError(w, err)
				return
			}
			next(w, r, app)
		})
	}
}

// RoomCdnOf returns app's room's CDN settings, as GetRoomCdn does for a call of that app.
func (a *API) RoomCdnOf(ctx context.Context, app, room string) (*apipb.RoomCdn, error) {
	return a.GetRoomCdn(context.WithValue(ctx, appKey{}, app), &apipb.GetRoomCdnRequest{Room: room})
}
