package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"roomcast/proto/roomcastpb"
	"roomcast/sdk"
)

func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdk.Dial(ctx, sdk.Config{
		Token:      "eyJ...", // minted by the app server
		Dispatcher: "http://127.0.0.1:8080",
		OnMessage: func(m *roomcastpb.Message) {
			fmt.Printf("%s: %s\n", m.GetSender(), m.GetBody())
		},
		OnClose: func(err error) {
			var ce *sdk.CloseError
			if errors.As(err, &ce) && !ce.Terminal() {
				log.Print("connection lost, dial again later: ", err)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ack, err := c.Send(ctx, sdk.Outgoing{Type: "chat", Body: []byte("hello")})
	var se *sdk.SendError
	switch {
	case errors.As(err, &se):
		log.Printf("refused (%d): %s", se.Code, se.Message)
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("sent as %s", ack.GetMessageId())
	}
}
