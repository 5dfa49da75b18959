// Command echo serves the example API with echo and the rate limiter.
//
//	go run ./examples/echo
//
// See examples/internal/demo for the limits.
package main

import (
	"log"
	"net/http"

	"github.com/labstack/echo/v4"

	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	app := demo.Start()
	api, login := app.API, app.Login

	e := echo.New()
	e.HideBanner = true
	if err := echoratelimit.Install(e, api); err != nil { // before the routes
		log.Fatal(err)
	}
	e.GET("/users/:id", func(c echo.Context) error {
		return c.String(http.StatusOK, "user "+c.Param("id")+"\n")
	})
	e.POST("/login", func(c echo.Context) error {
		return c.String(http.StatusOK, "welcome\n")
	}, echoratelimit.Route(login))
	e.GET("/report", func(c echo.Context) error {
		return c.String(http.StatusOK, "an expensive report\n")
	})
	app.Serve(e)
}
