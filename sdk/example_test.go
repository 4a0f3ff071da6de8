package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/sdk"
)

func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdk.Dial(ctx, sdk.Config{
		Token:      "eyJ...", // minted by the app server
		Dispatcher: "http://127.0.0.1:8080",
		OnMessage: func(m *clientpb.Message) {
			fmt.Printf("%s: %s\n", m.GetSender(), m.GetBody())
		},
		OnEvent: func(ev sdk.Event) {
			switch e := ev.(type) {
			case *sdk.RecoveredEvent:
				if !e.Recovered {
					log.Printf("%d messages were lost while reconnecting", e.Missing)
				}
			case *sdk.ClosedEvent:
				log.Print("stopped: ", e.Err)
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
