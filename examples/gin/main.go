// Command gin serves the example API with gin and the rate limiter.
//
//	go run ./examples/gin
//
// See examples/internal/demo for the limits.
package main

import (
	"net/http"

	"github.com/gin-gonic/gin"

	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	app := demo.Start()
	gin.SetMode(gin.ReleaseMode)
	g := gin.New()
	g.Use(ginratelimit.Middleware(app.API)) // before the routes, as gin requires; POST /login's own limit is in app.API's route table
	g.GET("/users/:id", func(c *gin.Context) {
		c.String(http.StatusOK, "user %s\n", c.Param("id"))
	})
	g.POST("/login", func(c *gin.Context) {
		c.String(http.StatusOK, "welcome\n")
	})
	g.GET("/report", func(c *gin.Context) {
		c.String(http.StatusOK, "an expensive report\n")
	})
	app.Serve(g)
}
